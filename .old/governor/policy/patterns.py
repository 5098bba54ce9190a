"""The ADL Core §4.4 pattern language: a glob subset, never regular expressions.

Three kinds of subject, each with its own segment separators:

hosts        `*` matches zero or more characters inside one DNS label (never crosses
             `.`); `**` is invalid. Case-insensitive; one trailing dot (FQDN form)
             is ignored on the subject.
paths        `*` matches zero or more characters inside one segment (never crosses
             `/`); `**` as a whole segment matches any number of segments, zero
             included (`/data/**` matches `/data`, `/data/a` and `/data/a/b`).
             Case-sensitive. The subject is normalised lexically first (repeated
             slashes collapsed, `.` dropped, `..` resolved, never above the root,
             a trailing slash ignored), so `/data/../secrets/x` is matched as
             `/secrets/x` and cannot slip past a pattern.
identifiers  agent ids (`https://d/agents/x`, `did:web:d:agents:x`,
             `urn:adl:agent:ns:name:1.0.0`): segments are separated by `/` and
             `:`; `*` never crosses either, `**` as a whole segment matches any
             number of segments with their separators. Case-sensitive.

Every other character is literal (`.`, `?`, `[`, `+`, ... included). A `**` that is
not a whole segment is an error, as is an empty pattern: patterns are compiled once,
when the passport's limits are, and a bad one refuses the passport rather than
matching something unintended.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import Callable, Iterable


class PatternError(ValueError):
    """A pattern outside the §4.4 language; says which pattern and why."""


@dataclass(frozen=True, slots=True)
class Pattern:
    """One compiled pattern: `matches(subject)`; `text` is the pattern as declared."""

    text: str
    kind: str
    _regex: re.Pattern[str]
    _normalise: Callable[[str], str]

    def matches(self, subject: str) -> bool:
        return self._regex.fullmatch(self._normalise(subject)) is not None


def _same(subject: str) -> str:
    return subject


def _normalise_host(subject: str) -> str:
    subject = subject.lower()
    return subject[:-1] if subject.endswith(".") else subject


def normalise_path(subject: str) -> str:
    """Lexical normalisation of a path subject (no file system access)."""
    if not subject:
        return subject
    normalised = posixpath.normpath(subject)
    if normalised.startswith("//"):  # normpath keeps a leading double slash (POSIX)
        normalised = "/" + normalised.lstrip("/")
    if normalised == ".":
        return ""
    return normalised


def _segment_regex(segment: str, stop: str) -> str:
    """Regex for one segment: `*` becomes "anything but a separator", the rest is literal."""
    return f"[^{stop}]*".join(re.escape(piece) for piece in segment.split("*"))


def _compile(text: str, kind: str, separators: str, globstar: bool) -> re.Pattern[str]:
    if not isinstance(text, str) or text == "":
        raise PatternError(f"{kind} pattern must be a non-empty string, got {text!r}")
    stop = re.escape(separators)
    tokens = re.split(f"([{stop}])", text)
    segments, seps = tokens[0::2], tokens[1::2]
    if len(segments) == 1 and segments[0] == "**":
        if not globstar:
            raise PatternError(f"{kind} pattern {text!r}: '**' is not allowed in {kind} patterns")
        return re.compile(r"(?s:.*)")
    parts: list[str] = []
    for index, segment in enumerate(segments):
        if "**" in segment:
            if not globstar:
                raise PatternError(f"{kind} pattern {text!r}: '**' is not allowed in {kind} patterns")
            if segment != "**":
                raise PatternError(f"{kind} pattern {text!r}: '**' must be a whole segment, not part of {segment!r}")
            if index == 0:
                # leading `**/`: zero or more segments, each with the separator after it
                parts.append(f"(?:[^{stop}]*[{stop}])*")
            else:
                # `/**`: zero or more segments, each with the separator before it
                parts.append(f"(?:[{stop}][^{stop}]*)*")
            continue
        if index > 0 and not (index == 1 and segments[0] == "**"):
            parts.append(re.escape(seps[index - 1]))
        parts.append(_segment_regex(segment, stop))
    return re.compile("".join(parts), re.IGNORECASE if kind == "host" else 0)


def compile_host(text: str) -> Pattern:
    # Hosts compare case-insensitively: lower the pattern too so `re.IGNORECASE`'s
    # Unicode folding never surprises.
    return Pattern(text, "host", _compile(text.lower().rstrip("."), "host", ".", False), _normalise_host)


def compile_path(text: str) -> Pattern:
    body = text[:-1] if len(text) > 1 and text.endswith("/") else text
    return Pattern(text, "path", _compile(body, "path", "/", True), normalise_path)


def compile_identifier(text: str) -> Pattern:
    return Pattern(text, "identifier", _compile(text, "identifier", "/:", True), _same)


@dataclass(frozen=True, slots=True)
class Verdict:
    allowed: bool
    rule: str | None  # the pattern that decided ("deny:<p>" or "match:<p>"), None when nothing matched


@dataclass(frozen=True, slots=True)
class PatternSet:
    """Allow patterns and deny patterns: deny wins, no match is deny."""

    allow: tuple[Pattern, ...]
    deny: tuple[Pattern, ...]

    def evaluate(self, subject: str) -> Verdict:
        for pattern in self.deny:
            if pattern.matches(subject):
                return Verdict(False, f"deny:{pattern.text}")
        for pattern in self.allow:
            if pattern.matches(subject):
                return Verdict(True, f"match:{pattern.text}")
        return Verdict(False, None)


def pattern_set(allow: Iterable[str], deny: Iterable[str], compile_one: Callable[[str], Pattern]) -> PatternSet:
    return PatternSet(tuple(compile_one(p) for p in allow), tuple(compile_one(p) for p in deny))
