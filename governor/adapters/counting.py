"""The governor's own count of the output it relays: a lower bound on any honest tokenizer's.

Measure, don't believe: a provider's `usage` is what it says it used; the governor also
counts what it actually relayed (output text, reasoning or thinking text it delivered,
tool-call names and arguments) and charges the larger of the two. The count must never
exceed what an honest provider reports, or an honest call would be overcharged, so it is a
*lower bound* on the token count, built from two facts about real tokenizers:

1. **No token is longer than 128 bytes** (`MAX_TOKEN_BYTES`). Measured on the vocabularies
   that ship in packages (the tiktoken files of `cl100k_base`, 100,256 tokens: GPT-3.5/4;
   `o200k_base`, 199,998 tokens: GPT-4o, o-series; `voyage3_base`, 151,643 tokens): the
   longest token of each is 128 bytes (a run of spaces); the longest that is not a run of
   one byte is 114 (`//----...`); the longest word 36 (`latesAutoresizingMaskIntoConstraints`);
   the longest non-ASCII token 61 bytes (Thai, o200k). SentencePiece vocabularies (Llama 2,
   Gemma, Mistral) cap a piece at 16 characters (64 bytes) by default. So ceil(bytes / 128)
   tokens at least.
2. **A token never spans ASCII whitespace between two non-whitespace characters.** The
   pre-tokenizers split text before BPE merges (cl100k's and o200k's, Llama 3's and Qwen's
   regexes; SentencePiece's whitespace splitting): whitespace may only lead a piece (" word")
   or form pieces of its own. So each maximal run of non-whitespace bytes (a "word") is at
   least one token of its own: at least `words` tokens.

The count is max(words, ceil(bytes / 128)). On English prose it is about 0.75 of the true
count (≈ 1.3 tokens a word); on text without spaces (CJK, base64) it is far below it, but
never 0 for non-empty text. tests/test_measured_usage.py checks it against the real
cl100k and o200k encodings on many shapes of text (English, code, CJK, emoji, runs of
spaces, base64, numbers). Only ASCII whitespace separates words here (bytes.split): other
characters some tokenizers treat as space would only split words further, which the
count ignores (it can only be lower for it).

Counting is incremental (streams): a word cut across two deltas is counted once.
The words of a stream's deltas are counted in batches (OutputCounter), off the per-chunk path.
"""

from __future__ import annotations

from typing import Any

import orjson

from governor.policy.steps import UsageReport

# the longest token of any measured vocabulary (see the module docstring)
MAX_TOKEN_BYTES = 128

_WS = frozenset(b" \t\n\r\x0b\x0c")
BATCH = 64  # pieces kept before their words are counted (OutputCounter)


def lower_bound(nbytes: int, words: int) -> int:
    """The count: max(words, ceil(nbytes / MAX_TOKEN_BYTES))."""
    by_bytes = -(-nbytes // MAX_TOKEN_BYTES)
    return words if words > by_bytes else by_bytes


def count_text(text: str) -> int:
    """The count of one whole text."""
    raw = text.encode("utf-8", "surrogatepass")
    return lower_bound(len(raw), len(raw.split()))


class OutputCounter:
    """The running count of a relayed output, fed its pieces (deltas) in order.

    On a stream's hot path: `add` only measures a piece's bytes and keeps it; its words are
    counted in batches (one join and one bytes.split per `BATCH` pieces, or when asked), so a
    delta costs a few attribute updates. `words_within` answers "is the count of words at most
    n?" from an upper bound (a word takes a byte and a separator) without counting, while it
    can."""

    __slots__ = ("nbytes", "_words", "_open", "_pending", "_settled_bytes")

    def __init__(self) -> None:
        self.nbytes = 0
        self._words = 0
        self._open = False  # the text counted so far ended inside a word
        self._pending: list[str] = []  # pieces whose words are not counted yet
        self._settled_bytes = 0  # the bytes of the pieces counted (nbytes less the pending ones)

    def add(self, text: str) -> None:
        if not text:
            return
        if text.isascii():
            self.nbytes += len(text)
        else:
            try:
                self.nbytes += len(text.encode())
            except UnicodeEncodeError:  # a lone surrogate (a lenient JSON parser's): 3 bytes, as it decodes
                self.nbytes += len(text.encode("utf-8", "surrogatepass"))
        pending = self._pending
        pending.append(text)
        if len(pending) >= BATCH:
            self._settle()

    def add_value(self, value: Any) -> None:
        """A piece that should be text (a delta's field): counted only when it is."""
        if type(value) is str:
            self.add(value)

    def add_separate(self, text: str) -> None:
        """A piece that is tokenized apart from what came before (a tool's name)."""
        self._settle()
        self._open = False
        self.add(text)
        self._settle()
        self._open = False

    def _settle(self) -> None:
        """Count the words of the pending pieces (as one text: a word cut across pieces once)."""
        pending = self._pending
        if not pending:
            return
        text = pending[0] if len(pending) == 1 else "".join(pending)
        self._pending = []
        self._settled_bytes = self.nbytes
        try:
            raw = text.encode()
        except UnicodeEncodeError:
            raw = text.encode("utf-8", "surrogatepass")
        words = len(raw.split())
        if words and self._open and raw[0] not in _WS:
            words -= 1  # the word the text counted before ended in goes on
        self._words += words
        self._open = raw[-1] not in _WS

    @property
    def words(self) -> int:
        self._settle()
        return self._words

    def words_within(self, limit: int) -> bool:
        """Whether the words so far are at most `limit`; counts the pending pieces only when
        their bound (a word per two bytes, rounded up) does not settle it."""
        if self._words + (self.nbytes - self._settled_bytes + 1) // 2 <= limit:
            return True
        self._settle()
        return self._words <= limit

    @property
    def tokens(self) -> int:
        return lower_bound(self.nbytes, self.words)

def measured(reported: UsageReport | None, counted: int, *, model: str, expected_input: int,
             persona: str | None, final: bool = True) -> UsageReport:
    """The usage to charge for an answer: the provider's report with its output raised to the
    governor's count when the count is larger; without a report, the count and the
    admission's expected input (never 0). Both figures are kept on the report, so the
    decision point can say which was charged (policy.anomaly.usage_deviation)."""
    if reported is None:
        return UsageReport(model=model, input_tokens=expected_input, output_tokens=counted, persona=persona,
                           final=final, reported_output_tokens=None, counted_output_tokens=counted)
    return UsageReport(model=reported.model, input_tokens=reported.input_tokens,
                       output_tokens=max(reported.output_tokens, counted),
                       cached_input_tokens=reported.cached_input_tokens, persona=persona, final=final,
                       reported_output_tokens=reported.output_tokens, counted_output_tokens=counted)


def add_arguments(counter: OutputCounter, value: Any) -> None:
    """A tool call's arguments as relayed (a JSON string, or parsed JSON written back compact,
    no longer than the JSON the model generated), counted apart from what came before; a
    value orjson cannot write back (an integer past 64 bits) counts nothing."""
    if value is None:
        return
    if type(value) is str:
        counter.add_separate(value)
        return
    try:
        counter.add_separate(orjson.dumps(value).decode())
    except (TypeError, orjson.JSONEncodeError):
        pass
