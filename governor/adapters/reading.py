"""Reading agent and upstream JSON without trusting its shape: fields coerced to what the
parser expects, answers JSON only to a lenient parser told apart (and refused), offered tools' names, and the
tool calls an answer asks the agent to run."""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

import orjson

from governor.adapters.base import UnreadableAnswer
from governor.adapters.shapes import LENIENT_PARSE_LIMIT
from governor.policy.steps import ToolCall


def tool_names(tools: Sequence[Any], key_path: Sequence[str]) -> tuple[str, ...]:
    """Names of offered tools: each tool's name found by following key_path
    (e.g. ("function", "name") for OpenAI chat, ("name",) for Anthropic)."""
    names = []
    for tool in tools:
        value: Any = tool
        for key in key_path:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, str):
            names.append(value)
    return tuple(names)


def answered_object(status: int, body: bytes) -> dict[str, Any] | None:
    """A 200 answer's JSON object, or None (another status, not JSON, not an object): an
    answer with nothing in it to observe."""
    if status != 200:
        return None
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


LENIENT_ANSWER = ("the upstream's answer is JSON only to a lenient parser (NaN, Infinity, an encoding orjson "
                  "refuses); it was refused rather than relayed unread")


def readable_answer(status: int, body: bytes) -> dict[str, Any] | None:
    """answered_object, refusing (UnreadableAnswer) a 200 answer that is JSON only to a lenient
    parser (lenient_only): what an SDK would read and the governor could not."""
    data = answered_object(status, body)
    if data is None and status == 200 and lenient_only(body):
        raise UnreadableAnswer(LENIENT_ANSWER)
    return data


LENIENT_EVENT = ("the upstream sent a stream event that is JSON only to a lenient parser (NaN, Infinity, a lone "
                 "surrogate); the stream was cut rather than relayed unread")


def lenient_only(raw: bytes | str) -> bool:
    """Whether `raw` is JSON to Python's json but not to orjson: NaN, Infinity, 1e400, a lone
    surrogate escape, a BOM or UTF-16/32, nesting past orjson's 1024 levels. The official SDKs
    parse answers with Python's json (httpx's Response.json, json.loads of each SSE event's
    data), so such an answer could carry tool calls the governor never read: the adapter
    refuses it (UnreadableAnswer). Called only where orjson already failed or gave no object
    (off the common path); past LENIENT_PARSE_LIMIT it is not tried and counts as readable
    (fail closed)."""
    try:
        orjson.loads(raw)
        return False
    except orjson.JSONDecodeError:
        pass
    if len(raw) > LENIENT_PARSE_LIMIT:
        return True
    try:
        json.loads(raw)
    except (ValueError, RecursionError):  # not JSON to Python either: the SDK raises, nothing is read
        return False
    return True


def as_dict(value: Any) -> dict[str, Any]:
    """A JSON field the parser expects to be an object, or {} when it is anything else
    (an upstream's or agent's bytes: a list where a dict belongs must not raise)."""
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    """A JSON field expected to be an array, or [] when it is anything else."""
    return value if isinstance(value, list) else []


def as_key(value: Any) -> int | str | None:
    """A JSON value used as a dict key (a stream's block or tool-call index): None unless
    an int or a string (a list would be unhashable)."""
    return value if isinstance(value, (int, str)) else None


def positive_int(value: Any) -> int:
    """A token count or limit from a body: a positive integer, else 0 (absent, bad, bool)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def requested_tool_call(name: Any, arguments: Any, persona: str | None) -> ToolCall | None:
    """A tool call an LLM response asks the agent to run (announced, see ToolCall.origin)."""
    if not isinstance(name, str) or not name:
        return None
    args = parse_arguments(arguments)
    return ToolCall(tool=name, arguments=args, target_path=target_path(args), persona=persona, origin="model")


def parse_arguments(raw: Any) -> dict[str, Any]:
    """Tool-call arguments as a mapping: JSON text is parsed; anything unparseable is kept
    under "_raw" so the step (and a loop signature) still sees it."""
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        if not raw.strip():
            return {}
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return {"_raw": raw}
        return value if isinstance(value, dict) else {"_value": value}
    return {} if raw is None else {"_value": raw}


# Argument names taken as the path a tool call targets (oversight's path_matches).
TARGET_PATH_KEYS = ("path", "file_path", "filepath", "filename", "file", "url", "uri", "target")


def target_path(arguments: Mapping[str, Any]) -> str | None:
    for key in TARGET_PATH_KEYS:
        value = arguments.get(key)
        if isinstance(value, str) and value:
            return value
    return None
