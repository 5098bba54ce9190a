"""Core §4.4 patterns: hosts, paths, agent identifiers; deny wins, no match is deny."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from governor.policy.patterns import (
    PatternError,
    compile_host,
    compile_identifier,
    compile_path,
    normalise_path,
    pattern_set,
)


# --- hosts ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pattern, host, expected",
    [
        ("api.example.com", "api.example.com", True),
        ("api.example.com", "API.Example.COM", True),  # hosts are case-insensitive
        ("API.EXAMPLE.COM", "api.example.com", True),
        ("api.example.com", "api.example.com.", True),  # FQDN trailing dot
        ("api.example.com", "apixexample.com", False),  # the dot is literal, not "any char"
        ("*.example.com", "a.example.com", True),
        ("*.example.com", "a.b.example.com", False),  # * never crosses a dot
        ("*.example.com", "example.com", False),
        ("*.example.com", ".example.com", True),  # * matches zero characters
        ("api-*.example.com", "api-.example.com", True),
        ("api-*.example.com", "api-eu.example.com", True),
        ("api-*.example.com", "api-eu.x.example.com", False),
        ("*", "localhost", True),
        ("*", "a.b", False),
        ("a+b.example.com", "a+b.example.com", True),  # regex metacharacters are literal
        ("a+b.example.com", "aab.example.com", False),
        ("a?b.example.com", "axb.example.com", False),
        ("[ab].example.com", "a.example.com", False),
    ],
)
def test_host_patterns(pattern, host, expected):
    assert compile_host(pattern).matches(host) is expected


@pytest.mark.parametrize("pattern", ["**.example.com", "a.**", "**", "x**.example.com"])
def test_double_star_is_invalid_in_hosts(pattern):
    with pytest.raises(PatternError, match=r"'\*\*' is not allowed in host patterns"):
        compile_host(pattern)


def test_empty_pattern_is_refused():
    for compile_one in (compile_host, compile_path, compile_identifier):
        with pytest.raises(PatternError, match="non-empty"):
            compile_one("")


# --- paths ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pattern, path, expected",
    [
        ("/data/*.txt", "/data/a.txt", True),
        ("/data/*.txt", "/data/.txt", True),  # * matches zero characters
        ("/data/*.txt", "/data/sub/a.txt", False),  # * never crosses /
        ("/data/*.txt", "/data/aXtxt", False),  # the dot is literal
        ("/data/*", "/data/", False),  # trailing slash ignored: the subject is /data
        ("/data/**", "/data", True),  # ** matches zero segments
        ("/data/**", "/data/", True),
        ("/data/**", "/data/a", True),
        ("/data/**", "/data/a/b/c", True),
        ("/data/**", "/datax", False),
        ("/data/**", "/datax/y", False),
        ("/data/**/drafts", "/data/drafts", True),
        ("/data/**/drafts", "/data/a/b/drafts", True),
        ("/data/**/drafts", "/data/a/xdrafts", False),
        ("/data/**/drafts", "/data/a/drafts/x", False),
        ("**/secret.txt", "secret.txt", True),
        ("**/secret.txt", "/secret.txt", True),
        ("**/secret.txt", "/a/b/secret.txt", True),
        ("**", "/anything/at/all", True),
        ("/data/x/", "/data/x", True),  # trailing slash on the pattern is insignificant
        ("/data/x", "/data/x/", True),
        ("/Data/x", "/data/x", False),  # paths are case-sensitive
        ("/data/**", "/data/../etc/passwd", False),  # normalised before matching
        ("/etc/**", "/data/../etc/passwd", True),
        ("/data/**", "//data//a", True),
        ("/data/a/*", "/data/a/./b", True),
        ("/", "/", True),
    ],
)
def test_path_patterns(pattern, path, expected):
    assert compile_path(pattern).matches(path) is expected


@pytest.mark.parametrize("pattern", ["/data/**.txt", "/a**/b", "/**x"])
def test_double_star_must_be_a_whole_segment(pattern):
    with pytest.raises(PatternError, match="whole segment"):
        compile_path(pattern)


def test_path_normalisation_never_climbs_above_root():
    assert normalise_path("/../../etc") == "/etc"
    assert normalise_path("/a/b/../c/") == "/a/c"


# --- identifiers ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "pattern, identifier, expected",
    [
        ("https://partners.example/agents/*", "https://partners.example/agents/bot", True),
        ("https://partners.example/agents/*", "https://partners.example/agents/bot/x", False),  # * stops at /
        ("https://partners.example/agents/*", "https://partners.example/agents/", True),  # * matches zero chars
        ("https://partners.example/agents/**", "https://partners.example/agents", True),
        ("https://partners.example/agents/**", "https://partners.example/agents/a/b", True),
        ("https://partners.example/agents/**", "https://partners.example/agentsX", False),
        ("https://*.example/agents/x", "https://a.example/agents/x", True),
        ("did:web:partners.example:agents:*", "did:web:partners.example:agents:bot", True),
        ("did:web:partners.example:agents:*", "did:web:partners.example:agents:bot:v2", False),  # * stops at :
        ("did:web:partners.example:**", "did:web:partners.example:agents:bot", True),
        ("did:web:partners.example:agents:*", "did:web:partnersXexample:agents:bot", False),
        ("urn:adl:agent:acme:*:1.0.0", "urn:adl:agent:acme:bot:1.0.0", True),
        ("urn:adl:agent:acme:*:*", "urn:adl:agent:acme:bot:2.1.0", True),
        ("urn:adl:agent:acme:**", "urn:adl:agent:acme:bot:2.1.0", True),
        ("urn:adl:agent:acme:*", "urn:adl:agent:acme:bot:2.1.0", False),
        ("urn:adl:agent:Acme:*:*", "urn:adl:agent:acme:bot:1.0.0", False),  # case-sensitive
        ("*", "https://x", False),  # a lone * is one segment
        ("**", "https://anything/at:all", True),
    ],
)
def test_identifier_patterns(pattern, identifier, expected):
    assert compile_identifier(pattern).matches(identifier) is expected


# --- sets: deny wins, no match is deny -------------------------------------------------


def test_deny_wins_over_match_and_no_match_is_deny():
    rules = pattern_set(
        ["https://partners.example/agents/*"], ["https://partners.example/agents/evil"], compile_identifier
    )
    ok = rules.evaluate("https://partners.example/agents/good")
    assert ok.allowed and ok.rule == "match:https://partners.example/agents/*"
    denied = rules.evaluate("https://partners.example/agents/evil")
    assert not denied.allowed and denied.rule == "deny:https://partners.example/agents/evil"
    unmatched = rules.evaluate("https://elsewhere.example/agents/x")
    assert not unmatched.allowed and unmatched.rule is None
    assert not pattern_set([], [], compile_identifier).evaluate("anything").allowed


# --- properties ----------------------------------------------------------------------

segment = st.text(alphabet=st.characters(blacklist_characters="/*", blacklist_categories=("Cs",)), min_size=1, max_size=8)


@given(st.lists(segment, min_size=1, max_size=5))
def test_literal_path_pattern_matches_only_itself(segments):
    path = "/" + "/".join(s for s in segments if s not in (".", ".."))
    if path == "/":
        return
    pattern = compile_path(re.sub(r"/+", "/", path))
    assert pattern.matches(normalise_path(path))
    assert not pattern.matches(normalise_path(path) + "x/y")


@given(st.lists(segment, min_size=1, max_size=4), segment)
def test_single_star_never_crosses_a_separator(prefix, extra):
    base = "/" + "/".join(s for s in prefix if s not in (".", ".."))
    if base == "/":
        return
    pattern = compile_path(base + "/*")
    assert pattern.matches(base + "/" + extra.replace(".", "x"))
    assert not pattern.matches(base + "/" + extra.replace(".", "x") + "/more")
