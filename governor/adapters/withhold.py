"""Withhold what the step may not use: offered tools outside the permitted set are removed
from a model request before the model sees them (docs/tools.md).

The permitted set is the policy's (governor/policy/tools.py: the passport's `tools[]`,
narrowed to the persona's); it reaches the adapters as `Decision.allowed_tools` (model
calls) or the runtime's `allowed_tools` (MCP tools/list). This module reads tool entries
the way each wire protocol names them, refuses entries it cannot name (400, at open,
before anything is admitted), and rewrites the parsed body in place only when something
is withheld. A tool call the model makes anyway is still decided as a tool-call step.

Names. An entry is kept only when *every* name it carries is permitted, so no spelling
can smuggle an undeclared tool past a declared one (a Responses entry with `name` and a
chat-style `function.name`, say). OpenAI (chat and Responses): `function.name`,
`custom.name`, `name`, and the `type` of any tool that is not `function`/`custom` (a
built-in such as `web_search_preview` or `mcp` is named by its type: the passport must
declare a tool of that name to offer it). Anthropic: `name`; its `mcp_servers` (remote MCP
servers the provider calls) each name `mcp`. Legacy chat `functions`: `name`. Chat's
`web_search_options` (provider-run search without a tools entry): `web_search`. Names compare exactly (no case folding, no Unicode normalization).

tool_choice / function_call naming a withheld tool is dropped (the model then chooses
among what is left); one that only makes sense with tools (`required`, Anthropic `any`)
is dropped with the last tool, as is `parallel_tool_calls`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence
from urllib.parse import quote

from governor.adapters.request_view import BadRequest

# More tools than any provider accepts (OpenAI: 128): a bound on the walk, not a policy.
MAX_TOOLS = 10_000
HEADER = "ADL-Withheld-Tools"
WEB_SEARCH = "web_search"  # what chat's web_search_options offers, named as the Responses built-in
MAX_HEADER_CHARS = 1024  # the header value (and the log line's list) is cut past this
# What the record keeps of one withholding (the names are the agent's or an MCP server's
# text): the count, and the first RECORDED_NAMES names cut to RECORDED_NAME_CHARS each, so
# an offer of thousands of tools or of megabyte names leaves an event of a few KiB.
RECORDED_NAMES = 32
RECORDED_NAME_CHARS = 128
# OpenAI tool types whose entry carries its name elsewhere; any other type names the tool
_STRUCTURAL = frozenset({"function", "custom"})

Names = tuple[str, ...]
Reader = Callable[[Any], "Names | None"]


def openai_names(tool: Any) -> Names | None:
    """Every name an OpenAI (chat or Responses) tool entry or tool_choice carries; None
    when it carries none readable (not an object, a non-string name, ...)."""
    if type(tool) is not dict:
        return None
    names: list[str] = []
    kind = tool.get("type")
    if kind is not None and (type(kind) is not str or not kind):
        return None
    for holder in ("function", "custom"):
        if holder in tool:
            inner = tool[holder]
            name = inner.get("name") if type(inner) is dict else None
            if type(name) is not str or not name:
                return None
            names.append(name)
    if "name" in tool:
        name = tool["name"]
        if type(name) is not str or not name:
            return None
        names.append(name)
    if kind is not None and kind not in _STRUCTURAL:
        names.append(kind)
    return tuple(names) if names else None


def named_only(tool: Any) -> Names | None:
    """Anthropic tools and legacy chat functions: the entry's `name`."""
    name = tool.get("name") if type(tool) is dict else None
    return (name,) if type(name) is str and name else None


def mcp_server(entry: Any) -> Names | None:
    """Anthropic `mcp_servers` entries: a remote MCP server whose tools the provider runs
    (the governor never sees those calls), named `mcp` as OpenAI's built-in `mcp` tool is."""
    return ("mcp",) if type(entry) is dict else None


def web_search_options(value: Any) -> tuple[Names, ...]:
    """OpenAI chat's `web_search_options`: provider-run web search switched on without a
    `tools` entry, named `web_search` (the Responses built-in's type); 400 unless an object."""
    if type(value) is not dict:
        raise BadRequest("'web_search_options' must be an object")
    return ((WEB_SEARCH,),)  # one entry, as read_tools gives them


def read_tools(value: Any, field: str, reader: Reader) -> tuple[Names, ...]:
    """The names of each entry of a request's tool array, in order; BadRequest (400) for
    anything that is not an array of entries with readable names."""
    if not isinstance(value, list):
        raise BadRequest(f"'{field}' must be an array")
    if len(value) > MAX_TOOLS:
        raise BadRequest(f"'{field}' holds {len(value)} entries; the governor reads at most {MAX_TOOLS}")
    out = []
    for index, tool in enumerate(value):
        names = reader(tool)
        if names is None:
            raise BadRequest(f"'{field}[{index}]' must be an object naming its tool with a non-empty string "
                             "(the governor withholds tools by name, so it refuses one it cannot name)")
        out.append(names)
    return tuple(out)


def flat(per_entry: Iterable[Names]) -> Names:
    """The distinct names, in order (ModelCall.tools_offered)."""
    return tuple(dict.fromkeys(n for names in per_entry for n in names))


@dataclass(slots=True)
class _Cut:
    body: dict[str, Any]
    allowed: frozenset[str]
    withheld: dict[str, None]  # ordered set
    changed: bool = False

    def entries(self, field: str, per_entry: tuple[Names, ...]) -> bool | None:
        """Withhold the entries of body[field] not permitted. None: nothing withheld;
        False: all withheld (the field removed); True: some kept."""
        allowed = self.allowed
        keep = [i for i, names in enumerate(per_entry) if all(n in allowed for n in names)]
        if len(keep) == len(per_entry):
            return None
        for names in per_entry:
            self.withheld.update((n, None) for n in names if n not in allowed)
        self.changed = True
        if not keep:
            del self.body[field]
            return False
        entries = self.body[field]
        self.body[field] = [entries[i] for i in keep]
        return True

    def permits(self, names: Names | None) -> bool:
        if names is None:
            return False
        missing = [n for n in names if n not in self.allowed]
        self.withheld.update((n, None) for n in missing)
        return not missing

    def drop(self, *fields: str) -> None:
        for field in fields:
            if field in self.body:
                del self.body[field]
                self.changed = True


def _openai_choice(cut: _Cut, choice: Any) -> bool:
    """Whether an OpenAI tool_choice may stay (strings always: none/auto/required);
    an `allowed_tools` choice is narrowed in place."""
    if type(choice) is not dict:
        return True
    if choice.get("type") == "allowed_tools":
        # chat: {"allowed_tools": {"mode", "tools"}}; Responses: {"mode", "tools"}
        holder = choice.get("allowed_tools") if "allowed_tools" in choice else choice
        refs = holder.get("tools") if type(holder) is dict else None
        if type(refs) is not list or len(refs) > MAX_TOOLS:  # unreadable, or more than any tools array
            return False
        kept = [ref for ref in refs if cut.permits(openai_names(ref))]
        if len(kept) != len(refs):
            holder["tools"] = kept
            cut.changed = True
        return bool(kept)
    return cut.permits(openai_names(choice))


def withhold_openai(body: dict[str, Any], allowed: frozenset[str], tools: tuple[Names, ...] | None,
                    functions: tuple[Names, ...] | None,
                    web_search: tuple[Names, ...] | None = None) -> list[str] | None:
    """Withhold from an OpenAI chat or Responses body, in place; the withheld names, or
    None when the body is unchanged."""
    cut = _Cut(body, allowed, {})
    if tools and cut.entries("tools", tools) is False:
        cut.drop("tool_choice", "parallel_tool_calls")
    if "tool_choice" in body and not _openai_choice(cut, body["tool_choice"]):
        cut.drop("tool_choice")
    if functions and cut.entries("functions", functions) is False:  # legacy chat functions
        cut.drop("function_call")
    call = body.get("function_call")
    if type(call) is dict and not cut.permits(named_only(call)):
        cut.drop("function_call")
    if web_search and not cut.permits(web_search[0]):
        cut.drop("web_search_options")
    return list(cut.withheld) if cut.changed else None


def withhold_anthropic(body: dict[str, Any], allowed: frozenset[str], tools: tuple[Names, ...] | None,
                       mcp_servers: tuple[Names, ...] | None = None) -> list[str] | None:
    """Withhold from an Anthropic Messages body, in place (tools, tool_choice, mcp_servers)."""
    cut = _Cut(body, allowed, {})
    if tools and cut.entries("tools", tools) is False:
        cut.drop("tool_choice")
    if mcp_servers:
        cut.entries("mcp_servers", mcp_servers)
    choice = body.get("tool_choice")
    if type(choice) is dict and choice.get("type") == "tool" and not cut.permits(named_only(choice)):
        cut.drop("tool_choice")
    return list(cut.withheld) if cut.changed else None


def filter_listed(tools: list[Any], allowed: frozenset[str]) -> tuple[list[Any], list[str]] | None:
    """An MCP tools/list result's tools with only the permitted ones (an entry without a
    string name is dropped too: the server's bytes are not trusted); None when all stay."""
    kept, withheld = [], {}
    for tool in tools:
        name = tool.get("name") if type(tool) is dict else None
        if type(name) is str and name in allowed:
            kept.append(tool)
        else:
            withheld[name if type(name) is str else "<unnamed>"] = None
    if len(kept) == len(tools):
        return None
    return kept, list(withheld)


# --- telling the client ---------------------------------------------------------------


def rendered(names: Iterable[str], limit: int = MAX_HEADER_CHARS) -> str:
    """`a, b, +3 more`: each name percent-encoded outside [A-Za-z0-9_.:/@-] (a header value
    is ASCII without control characters; a comma or space in a name stays unambiguous),
    cut to about `limit` characters."""
    names = list(names)
    parts: list[str] = []
    size = 0
    for index, name in enumerate(names):
        part = quote(name, safe="_.-:/@")
        if size + len(part) + 2 > limit and parts:
            parts.append(f"+{len(names) - index} more")
            break
        parts.append(part[:limit])
        size += len(part) + 2
    return ", ".join(parts)


def recorded_detail(names: Sequence[str]) -> dict[str, Any]:
    """The withheld names as the record keeps them (the on_governor_tools_withheld detail's part):
    `count` (distinct names withheld), `tools` (the first RECORDED_NAMES, in offered order,
    each cut to RECORDED_NAME_CHARS characters), and, only when they apply, `tools_omitted`
    (names past the first RECORDED_NAMES) and `names_cut` (listed names that were cut).
    O(RECORDED_NAMES), whatever the number of names."""
    first = names[:RECORDED_NAMES]
    listed = [name[:RECORDED_NAME_CHARS] for name in first]
    detail: dict[str, Any] = {"count": len(names), "tools": listed}
    if len(names) > len(listed):
        detail["tools_omitted"] = len(names) - len(listed)
    cut = sum(1 for name in first if len(name) > RECORDED_NAME_CHARS)
    if cut:
        detail["names_cut"] = cut
    return detail


def withheld_of(state: Mapping[str, Any]) -> list[str] | None:
    """What the exchange withheld (set by the adapters under this key), if anything."""
    return state.get("withheld")


__all__ = ["HEADER", "MAX_TOOLS", "WEB_SEARCH", "web_search_options", "openai_names", "named_only", "mcp_server", "read_tools", "flat", "withhold_openai",
           "withhold_anthropic", "filter_listed", "rendered", "recorded_detail", "withheld_of"]
