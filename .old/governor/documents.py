"""JSON and YAML documents read into plain JSON values, exactly.

Passports and the files an auditor hands `governor verify` are hashed and signed
over their JCS bytes, so reading must not change any value: YAML is read with the
YAML 1.2 core schema (timestamps, `yes`/`no`, `0777` and `1:20` stay what JSON
would make of them; PyYAML's default YAML 1.1 resolver would turn ISO times into
datetime objects and so change the signed bytes). Anything JSON cannot carry (NaN,
infinities, binary, sets, non-string keys, integers beyond 2**53 that JCS would
round) and duplicate keys are refused with the JSON path of the offending value.

One module shared by the passport room and the evidence room, so a passport's
digest is the same whichever of them reads it; it imports neither.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.parser import Parser
from yaml.reader import Reader
from yaml.resolver import BaseResolver
from yaml.scanner import Scanner

JSON = "json"
YAML = "yaml"
_SAFE_INTEGER = 2**53 - 1  # I-JSON: beyond this JCS (IEEE doubles) would alter the value


class DocumentError(ValueError):
    """The text is not a JSON object that can be hashed and signed exactly."""


# --- YAML 1.2 core schema --------------------------------------------------------------


class _Yaml12CoreResolver(BaseResolver):
    """Implicit types of the YAML 1.2 core schema: null, bool, int, float; all else str."""


_Yaml12CoreResolver.add_implicit_resolver(
    "tag:yaml.org,2002:null", re.compile(r"^(?:~|null|Null|NULL|)$"), ["~", "n", "N", ""]
)
_Yaml12CoreResolver.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
# int before float: the resolver takes the first match, and "12" matches both.
_Yaml12CoreResolver.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"),
    list("-+0123456789"),
)
_Yaml12CoreResolver.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


class _DocumentConstructor(SafeConstructor):
    """SafeConstructor with YAML 1.2 integers, string keys only and no duplicate keys."""

    def construct_yaml_int(self, node: yaml.Node) -> int:
        text = str(self.construct_scalar(node))
        if text.startswith("0o"):
            return int(text[2:], 8)
        if text.startswith("0x"):
            return int(text[2:], 16)
        return int(text, 10)

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[str, Any]:
        if not isinstance(node, yaml.MappingNode):
            raise ConstructorError(None, None, f"expected a mapping, found {node.id}", node.start_mark)
        mapping: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, str):
                raise ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"found a non-string key {key!r} (JSON object keys are strings)", key_node.start_mark,
                )
            if key in mapping:
                raise ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"found duplicate key {key!r}", key_node.start_mark,
                )
            mapping[key] = self.construct_object(value_node, deep=deep)
        return mapping


_DocumentConstructor.add_constructor("tag:yaml.org,2002:int", _DocumentConstructor.construct_yaml_int)


class _DocumentYamlLoader(Reader, Scanner, Parser, Composer, _DocumentConstructor, _Yaml12CoreResolver):
    def __init__(self, stream: str) -> None:
        Reader.__init__(self, stream)
        Scanner.__init__(self)
        Parser.__init__(self)
        Composer.__init__(self)
        _DocumentConstructor.__init__(self)
        _Yaml12CoreResolver.__init__(self)


# --- JSON -------------------------------------------------------------------------------


def _object_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise DocumentError(f"duplicate key {key!r} in a JSON object")
        obj[key] = value
    return obj


def _reject_constant(name: str) -> Any:
    raise DocumentError(f"{name} is not a JSON value")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise DocumentError(f"number {text} is out of range for a JSON number")
    return value


def parse_document(data: bytes | str, *, format: str | None = None, source: str = "document",
                   what: str = "document") -> dict[str, Any]:
    """Parse JSON or YAML text (sniffed when `format` is None) into a JSON object; DocumentError says why."""
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise DocumentError(f"{source}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    else:
        text = data
    if format is None:
        format = JSON if text.lstrip().startswith(("{", "[")) else YAML
    if format == JSON:
        try:
            value = json.loads(
                text,
                object_pairs_hook=_object_without_duplicates,
                parse_constant=_reject_constant,
                parse_float=_finite_float,
            )
        except json.JSONDecodeError as exc:
            raise DocumentError(
                f"{source}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
            ) from None
        except DocumentError as exc:
            raise DocumentError(f"{source}: {exc}") from None
    elif format == YAML:
        try:
            value = yaml.load(text, Loader=_DocumentYamlLoader)  # noqa: S506 - safe constructor
        except yaml.YAMLError as exc:
            raise DocumentError(f"{source}: invalid YAML: {_one_line(exc)}") from None
    else:
        raise ValueError(f"unknown document format {format!r}")
    if not isinstance(value, dict):
        kind = "empty document" if value is None else f"a JSON {type_name(value)}"
        raise DocumentError(f"{source}: a {what} must be a JSON object (mapping), got {kind}")
    problem = first_non_json_value(value)
    if problem:
        raise DocumentError(f"{source}: {problem}")
    return value


def first_non_json_value(value: Any, path: str = "$") -> str | None:
    """Describe the first value JSON/JCS cannot carry exactly, with its JSON path; None if all can."""
    if value is None or isinstance(value, (bool, str)):
        return None
    if isinstance(value, int):
        if abs(value) > _SAFE_INTEGER:
            return f"{path}: integer {value} is beyond 2**53 and would change under JCS"
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{path}: {value} is not a JSON number"
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{path}: key {key!r} is not a string"
            problem = first_non_json_value(item, f"{path}{_member(key)}")
            if problem:
                return problem
        return None
    if isinstance(value, list):
        for index, item in enumerate(value):
            problem = first_non_json_value(item, f"{path}[{index}]")
            if problem:
                return problem
        return None
    return f"{path}: a {type(value).__name__} is not a JSON value"


def type_name(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "number",
            float: "number", type(None): "null"}.get(type(value), type(value).__name__)


def _member(key: str) -> str:
    return f".{key}" if re.fullmatch(r"[A-Za-z_$][A-Za-z0-9_$]*", key) else f"[{json.dumps(key)}]"


def _one_line(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
    return f"{problem}{where}" + (f" ({context})" if context else "")
