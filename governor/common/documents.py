"""JSON and YAML documents read into plain JSON values, exactly.

Passports and the files an auditor hands `governor verify` are hashed and signed
over their JCS bytes, so reading must not change any value: YAML is read with the
YAML 1.2 core schema (timestamps, `yes`/`no`, `0777` and `1:20` stay what JSON
would make of them; PyYAML's default YAML 1.1 resolver would turn ISO times into
datetime objects and so change the signed bytes). Anything JSON cannot carry (NaN,
infinities, binary, sets, non-string keys, integers beyond 2**53 that JCS would
round) and duplicate keys are refused with the JSON path of the offending value.

Bounded, because these bytes may be an adversary's (a passport in an ADL-Passport
header, a peer's passport, a record handed to an auditor): at most `max_bytes`
(MAX_DOCUMENT_BYTES by default), nesting at most MAX_DEPTH levels, and YAML
without anchors or aliases (a 560-byte "billion laughs" header otherwise expands
into gigabytes), each refused with a DocumentError saying which bound.

One module shared by the passport room and the evidence room, so a passport's
digest is the same whichever of them reads it; it imports neither.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Callable

import os
from pathlib import Path

import yaml
from yaml.composer import Composer
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.error import MarkedYAMLError
from yaml.events import AliasEvent, CollectionStartEvent, ScalarEvent
from yaml.parser import Parser
from yaml.reader import Reader
from yaml.resolver import BaseResolver
from yaml.scanner import Scanner

try:  # libyaml's scanner and parser: the same events, several times faster than PyYAML's own
    from yaml._yaml import CParser as _FastParser
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    _FastParser = None

JSON = "json"
YAML = "yaml"
_SAFE_INTEGER = 2**53 - 1  # I-JSON: beyond this JCS (IEEE doubles) would alter the value
MAX_DOCUMENT_BYTES = 4 * 1024 * 1024  # a passport is a few KiB; a record of a long session a few hundred
_SURROGATE = re.compile("[\ud800-\udfff]")
MAX_DEPTH = 64  # nesting levels (objects and arrays); passports and records use fewer than ten


class DocumentError(ValueError):
    """The text is not a JSON object that can be hashed and signed exactly."""


class DocumentBoundError(DocumentError):
    """The text exceeds a bound (size, nesting) or uses YAML anchors/aliases."""


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


class _BoundedComposer(Composer):
    """Composes the node tree refusing anchors and aliases, and nesting past `max_depth`.

    Refused at the event that names them, before any node is built: an alias makes
    the document a graph whose expansion (by anything that walks it: the JSON
    check, JCS, the digest) is exponential in its size.
    """

    max_depth = MAX_DEPTH

    def __init__(self) -> None:
        Composer.__init__(self)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, AliasEvent):
            raise _YamlBoundError(f"YAML aliases (*{event.anchor}) are not accepted", event.start_mark)
        if isinstance(event, (ScalarEvent, CollectionStartEvent)) and event.anchor is not None:
            raise _YamlBoundError(f"YAML anchors (&{event.anchor}) are not accepted", event.start_mark)
        if isinstance(event, CollectionStartEvent):
            self._depth += 1
            if self._depth > self.max_depth:
                raise _YamlBoundError(f"nesting deeper than {self.max_depth} levels", event.start_mark)
            try:
                return Composer.compose_node(self, parent, index)
            finally:
                self._depth -= 1
        return Composer.compose_node(self, parent, index)


class _YamlBoundError(MarkedYAMLError):
    def __init__(self, problem: str, mark: Any) -> None:
        super().__init__(problem=problem, problem_mark=mark)


class _DocumentYamlLoader(Reader, Scanner, Parser, _BoundedComposer, _DocumentConstructor, _Yaml12CoreResolver):
    def __init__(self, stream: str) -> None:
        Reader.__init__(self, stream)
        Scanner.__init__(self)
        Parser.__init__(self)
        _BoundedComposer.__init__(self)
        _DocumentConstructor.__init__(self)
        _Yaml12CoreResolver.__init__(self)


if _FastParser is not None:
    class _FastDocumentYamlLoader(_BoundedComposer, _FastParser, _DocumentConstructor, _Yaml12CoreResolver):
        """libyaml's events under the same (Python) composer, constructor and resolver."""

        def __init__(self, stream: str) -> None:
            _FastParser.__init__(self, stream)
            _BoundedComposer.__init__(self)
            _DocumentConstructor.__init__(self)
            _Yaml12CoreResolver.__init__(self)

    _Loader: type = _FastDocumentYamlLoader
else:  # pragma: no cover
    _Loader = _DocumentYamlLoader


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


def read_document_bytes(path: str | os.PathLike[str], *, max_bytes: int = MAX_DOCUMENT_BYTES) -> bytes:
    """A file's bytes, reading no more than `max_bytes` + 1 of it (DocumentBoundError past the cap).

    OSError as open/read raise it: the callers name the file in their own error."""
    with open(Path(path), "rb") as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise DocumentBoundError(f"{path}: larger than {max_bytes} bytes")
    return data


def read_document_file(path: str | os.PathLike[str], error: Callable[[str], Exception], *,
                       max_bytes: int = MAX_DOCUMENT_BYTES) -> bytes:
    """read_document_bytes, a file that cannot be read or is too large raised as `error(reason)`
    (the reason names the file), for the readers of passports, records and DID documents."""
    try:
        return read_document_bytes(path, max_bytes=max_bytes)
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror or exc}") from None
    except DocumentError as exc:
        raise error(str(exc)) from None


def parse_document(data: bytes | str, *, format: str | None = None, source: str = "document",
                   what: str = "document", max_bytes: int = MAX_DOCUMENT_BYTES) -> dict[str, Any]:
    """Parse JSON or YAML text (sniffed when `format` is None) into a JSON object; DocumentError says why.

    At most `max_bytes` (UTF-8) and MAX_DEPTH levels of nesting; YAML without anchors or aliases."""
    size = len(data) if isinstance(data, bytes) else len(data.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise DocumentBoundError(f"{source}: {size} bytes is larger than the limit of {max_bytes} bytes")
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
        except RecursionError:  # the C decoder stops at the interpreter's recursion limit, cleanly
            raise DocumentBoundError(f"{source}: JSON nesting deeper than {MAX_DEPTH} levels") from None
        if _deeper_than(value, MAX_DEPTH):
            raise DocumentBoundError(f"{source}: JSON nesting deeper than {MAX_DEPTH} levels")
    elif format == YAML:
        try:
            value = yaml.load(text, Loader=_Loader)  # noqa: S506 - safe constructor, no aliases
        except _YamlBoundError as exc:
            raise DocumentBoundError(f"{source}: YAML refused: {_one_line(exc)}") from None
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


def _deeper_than(value: Any, limit: int) -> bool:
    """True when objects/arrays nest more than `limit` levels (iterative: no recursion to exhaust)."""
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def first_non_json_value(value: Any, path: str = "$") -> str | None:
    """Describe the first value JSON/JCS cannot carry exactly, with its JSON path; None if all can."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, str):
        # a lone surrogate (JSON's "\\ud800") is not Unicode text: I-JSON refuses it, JCS cannot encode it
        return f"{path}: string with a lone surrogate (not Unicode text)" if _SURROGATE.search(value) else None
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
            if _SURROGATE.search(key):
                return f"{path}: key with a lone surrogate (not Unicode text)"
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
    text = f"{problem}{where}" + (f" ({context})" if context else "")
    return " ".join(text.split())  # one line: a reader error's text spans two
