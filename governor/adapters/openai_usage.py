"""OpenAI's endpoints (Chat Completions, Responses, legacy Completions, Embeddings) and what
their answers say was used: the provider's usage object read without trusting it, and the
governor's own count of the output a plain answer delivers (governor.adapters.counting)."""

from __future__ import annotations

from typing import Any

from governor.adapters.counting import OutputCounter
from governor.adapters.reading import as_dict, as_list, positive_int
from governor.policy.steps import UsageReport

CHAT = "chat"
RESPONSES = "responses"
COMPLETIONS = "completions"  # the legacy text completions endpoint
EMBEDDINGS = "embeddings"


def _count(value: Any) -> bool:
    """A token count as a provider writes it: a non-negative integer (not a bool, a string, -3)."""
    return type(value) is int and value >= 0


def provider_usage(kind: str, usage: Any, model: str, persona: str | None, final: bool,
           expected_input: int) -> UsageReport | None:
    """The provider's usage; None when it has no believable output figure (absent, a string,
    negative: the answer is then charged as one without usage). An input figure that is not
    a count is replaced by the admission's `expected_input`, never read as 0."""
    if not isinstance(usage, dict):
        return None
    # the same usage under the Responses API's names and under Chat/Completions' names
    inputs, outputs = ("input_tokens", "output_tokens") if kind == RESPONSES else ("prompt_tokens", "completion_tokens")
    output = usage.get(outputs)
    if not _count(output):
        if kind != EMBEDDINGS:
            return None
        output = 0  # embeddings have no output
    given = usage.get(inputs)
    details = usage.get(inputs + "_details")
    return UsageReport(
        model=model,
        input_tokens=given if _count(given) else expected_input,
        output_tokens=output,
        cached_input_tokens=positive_int(details.get("cached_tokens")) if isinstance(details, dict) else 0,
        persona=persona,
        final=final,
    )



def answer_count(kind: str, data: dict[str, Any]) -> int:
    """The governor's count (adapters.counting) of the output a plain answer delivers: text,
    refusals, reasoning text, tool-call names and arguments."""
    counter = OutputCounter()
    add = counter.add_value
    if kind == CHAT or kind == COMPLETIONS:
        for choice in as_list(data.get("choices")):
            if not isinstance(choice, dict):
                continue
            add(choice.get("text"))
            message = as_dict(choice.get("message"))
            for key in ("content", "refusal", "reasoning_content", "reasoning"):
                add(message.get(key))
            calls = as_list(message.get("tool_calls")) + [message.get("function_call")]
            for call in calls:
                fn = as_dict(call.get("function")) if isinstance(call, dict) and "function" in call else as_dict(call)
                if type(fn.get("name")) is str:
                    counter.add_separate(fn["name"])
                add(fn.get("arguments"))
    elif kind == RESPONSES:
        for item in as_list(data.get("output")):
            if not isinstance(item, dict):
                continue
            if type(item.get("name")) is str:
                counter.add_separate(item["name"])
            add(item.get("arguments"))
            add(item.get("input"))
            for part in as_list(item.get("content")) + as_list(item.get("summary")):
                if isinstance(part, dict):
                    add(part.get("text"))
                    add(part.get("refusal"))
    return counter.tokens
