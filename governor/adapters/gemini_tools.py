"""The tools a Gemini request offers, read and withheld (docs/tools.md; the shared rules are
governor/adapters/withhold.py's).

A Gemini `tools` entry is a Tool object that may hold several things at once: a list of
`functionDeclarations` (each named by its `name`) and provider-run tools (`googleSearch`,
`codeExecution`, `urlContext`, `googleMaps`, `fileSearch`, ...), each named by its key. The
API reads its JSON as protocol buffers do, so every field may also be spelled in snake case
(`function_declarations`, `google_search`): a built-in is named by its key in lower camel
case whichever way it is spelled, so one passport name covers both spellings. What the
step may not use is withheld one declaration and one built-in at a time (an entry left
empty goes); `toolConfig.functionCallingConfig.allowedFunctionNames` is narrowed to what
is left, and the whole `toolConfig` goes with the last function.

A request naming the same field in both spellings (`generationConfig` and
`generation_config`, `functionDeclarations` and `function_declarations` in one entry) is
refused (400): which of the two the server reads is not the governor's to guess.
"""

from __future__ import annotations

from typing import Any

from governor.adapters.request_view import BadRequest
from governor.adapters.withhold import MAX_TOOLS

DECLARATIONS = ("functionDeclarations", "function_declarations")
TOOL_CONFIG = ("toolConfig", "tool_config")
_CALLING = ("functionCallingConfig", "function_calling_config")
_ALLOWED = ("allowedFunctionNames", "allowed_function_names")

# One entry, read: (function names per declaration list key, built-ins by key -> name)
Entry = tuple[dict[str, tuple[str, ...]], dict[str, str]]


def camel(key: str) -> str:
    """A proto field name in lower camel case (`google_search` -> `googleSearch`)."""
    if "_" not in key:
        return key
    head, *rest = key.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def one_of(body: dict[str, Any], spellings: tuple[str, ...], where: str) -> str | None:
    """The key under which `body` holds a field that has two spellings (lower camel case and
    snake case), or None; BadRequest when both are present."""
    present = [key for key in spellings if key in body]
    if len(present) > 1:
        raise BadRequest(f"{where} names {' and '.join(repr(k) for k in present)}: the same field twice; "
                         "the governor refuses it rather than guess which one the server reads")
    return present[0] if present else None


def read_tools(value: Any) -> tuple[Entry, ...]:
    """Each entry of a request's `tools`, its names read; BadRequest (400) for anything the
    governor cannot name (it withholds tools by name)."""
    if not isinstance(value, list):
        raise BadRequest("'tools' must be an array")
    if len(value) > MAX_TOOLS:
        raise BadRequest(f"'tools' holds {len(value)} entries; the governor reads at most {MAX_TOOLS}")
    out = []
    for index, tool in enumerate(value):
        where = f"'tools[{index}]'"
        if type(tool) is not dict or not tool:
            raise BadRequest(f"{where} must be a non-empty object (a Tool): the governor withholds tools by name, "
                             "so it refuses one it cannot name")
        one_of(tool, DECLARATIONS, where)
        functions: dict[str, tuple[str, ...]] = {}
        builtins: dict[str, str] = {}
        for key, inner in tool.items():
            if key in DECLARATIONS:
                if not isinstance(inner, list) or len(inner) > MAX_TOOLS:
                    raise BadRequest(f"{where}.{key} must be an array of at most {MAX_TOOLS} declarations")
                names = []
                for position, declaration in enumerate(inner):
                    name = declaration.get("name") if type(declaration) is dict else None
                    if type(name) is not str or not name:
                        raise BadRequest(f"{where}.{key}[{position}] must be an object naming its function with a "
                                         "non-empty string 'name'")
                    names.append(name)
                functions[key] = tuple(names)
            else:
                builtins[key] = camel(key)  # a provider-run tool, named by its kind
        out.append((functions, builtins))
    return tuple(out)


def offered(entries: tuple[Entry, ...]) -> tuple[str, ...]:
    """The distinct names offered, in order (ModelCall.tools_offered)."""
    names: dict[str, None] = {}
    for functions, builtins in entries:
        for declared in functions.values():
            names.update(dict.fromkeys(declared))
        names.update(dict.fromkeys(builtins.values()))
    return tuple(names)


def withhold(body: dict[str, Any], allowed: frozenset[str], entries: tuple[Entry, ...]) -> list[str] | None:
    """Withhold from a Gemini request body, in place; the withheld names, or None when the
    body is unchanged."""
    withheld: dict[str, None] = {}
    kept_entries = []
    functions_left = 0
    tools = body["tools"]
    for tool, (functions, builtins) in zip(tools, entries):
        for key, names in functions.items():
            keep = [i for i, name in enumerate(names) if name in allowed]
            if len(keep) != len(names):
                withheld.update((n, None) for n in names if n not in allowed)
                tool[key] = [tool[key][i] for i in keep]
            if not keep:
                del tool[key]
            functions_left += len(keep)
        for key, name in builtins.items():
            if name not in allowed:
                withheld[name] = None
                del tool[key]
        if tool:
            kept_entries.append(tool)
    if not withheld:
        return None
    if kept_entries:
        body["tools"] = kept_entries
    else:
        del body["tools"]
    _narrow_tool_config(body, allowed, functions_left)
    return list(withheld)


def _narrow_tool_config(body: dict[str, Any], allowed: frozenset[str], functions_left: int) -> None:
    """toolConfig without the withheld functions: gone with the last function; otherwise its
    allowedFunctionNames narrowed (the calling config dropped when none is left, so the
    model chooses among what is left instead of being forced to a withheld one)."""
    key = one_of(body, TOOL_CONFIG, "the request")
    if key is None:
        return
    config = body[key]
    if not functions_left or type(config) is not dict:
        del body[key]
        return
    calling_key = next((k for k in _CALLING if k in config), None)
    calling = config.get(calling_key) if calling_key else None
    if type(calling) is not dict:
        return
    for names_key in _ALLOWED:
        names = calling.get(names_key)
        if names is None:
            continue
        kept = [n for n in names if type(n) is str and n in allowed] if isinstance(names, list) else []
        if not kept:
            del config[calling_key]
            return
        calling[names_key] = kept


__all__ = ["DECLARATIONS", "TOOL_CONFIG", "camel", "one_of", "read_tools", "offered", "withhold"]
