"""Reading the admitted passport for §8.6 step 4, without importing the passport room.

The digest in a record is base64url(SHA-256(JCS(passport))) of the document as
the governor loaded it, so the verifier must read a YAML passport to the very
same JSON value: YAML 1.2 core schema (ISO times, `yes`/`no`, `0777`, `1:20` stay
text or decimal, as JSON would have them; PyYAML's default YAML 1.1 rules would
change them and so the digest), string keys only, no duplicate keys — the rules
of governor.passport.loader, which tests/test_verify_cli.py checks this against.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from governor.evidence.errors import InputError


def _yaml_loader():
    import yaml  # only when a YAML passport is given
    from yaml.composer import Composer
    from yaml.constructor import ConstructorError, SafeConstructor
    from yaml.parser import Parser
    from yaml.reader import Reader
    from yaml.resolver import BaseResolver
    from yaml.scanner import Scanner

    class CoreResolver(BaseResolver):
        """The YAML 1.2 core schema's implicit types: null, bool, int, float; all else str."""

    CoreResolver.add_implicit_resolver(
        "tag:yaml.org,2002:null", re.compile(r"^(?:~|null|Null|NULL|)$"), ["~", "n", "N", ""])
    CoreResolver.add_implicit_resolver(
        "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
    CoreResolver.add_implicit_resolver(  # int before float: "12" matches both
        "tag:yaml.org,2002:int", re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"), list("-+0123456789"))
    CoreResolver.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                   r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
        list("-+0123456789."),
    )

    class Constructor(SafeConstructor):
        def construct_yaml_int(self, node):
            text = str(self.construct_scalar(node))
            if text.startswith("0o"):
                return int(text[2:], 8)
            if text.startswith("0x"):
                return int(text[2:], 16)
            return int(text, 10)

        def construct_mapping(self, node, deep=False):
            if not isinstance(node, yaml.MappingNode):
                raise ConstructorError(None, None, f"expected a mapping, found {node.id}", node.start_mark)
            mapping: dict[str, Any] = {}
            for key_node, value_node in node.value:
                key = self.construct_object(key_node, deep=deep)
                if not isinstance(key, str):
                    raise ConstructorError(None, None, f"non-string key {key!r}", key_node.start_mark)
                if key in mapping:
                    raise ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
                mapping[key] = self.construct_object(value_node, deep=deep)
            return mapping

    Constructor.add_constructor("tag:yaml.org,2002:int", Constructor.construct_yaml_int)

    class Loader(Reader, Scanner, Parser, Composer, Constructor, CoreResolver):
        def __init__(self, stream):
            Reader.__init__(self, stream)
            Scanner.__init__(self)
            Parser.__init__(self)
            Composer.__init__(self)
            Constructor.__init__(self)
            CoreResolver.__init__(self)

    return yaml, Loader


def _unique_members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    members: dict[str, Any] = {}
    for key, value in pairs:
        if key in members:
            raise ValueError(f"duplicate key {key!r}")
        members[key] = value
    return members


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def load_passport(path: Path | str) -> dict[str, Any]:
    """The passport document in `path` (JSON, or YAML read as YAML 1.2 core); InputError otherwise.

    The format follows the suffix (.json, .yaml/.yml), else the first character.
    """
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    suffix = path.suffix.lower()
    as_json = suffix == ".json" or (suffix not in (".yaml", ".yml") and text.lstrip().startswith(("{", "[")))
    if as_json:
        try:
            document = json.loads(text, object_pairs_hook=_unique_members, parse_constant=_reject_constant)
        except ValueError as exc:
            raise InputError(f"{path} is not a JSON passport: {exc}") from None
    else:
        yaml, loader = _yaml_loader()
        try:
            document = yaml.load(text, Loader=loader)  # noqa: S506 - a safe constructor
        except yaml.YAMLError as exc:
            raise InputError(f"{path} is not a YAML passport: {' '.join(str(exc).split())}") from None
    if not isinstance(document, dict):
        raise InputError(f"{path} is not a passport: not a JSON or YAML object")
    return document
