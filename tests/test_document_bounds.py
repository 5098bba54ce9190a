"""Bounded parsing of passports, records and DID documents (issue #20, findings 1 and 8).

Every bound gets its refusal: size, nesting depth (JSON and YAML), YAML anchors and
aliases. The CLI runs as a real process: a bomb or a 10^5-level document exits 2
with a one-line message, never a traceback, an exit 1 or a hang.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from governor.cli import main
from governor.common.documents import (
    MAX_DEPTH,
    MAX_DOCUMENT_BYTES,
    DocumentBoundError,
    DocumentError,
    parse_document,
)
from governor.evidence.journal import recover_journal
from governor.evidence.errors import CorruptJournalError
from governor.passport import PassportLoadError, load_passport, parse_passport
from tests.conftest import REPO
from tests.hostile_documents import alias_bomb, nested_json, nested_yaml

CLI_BOUND = 60  # seconds: a hang, not a speed check (the process starts, imports, refuses)


# --- the parser ---------------------------------------------------------------------------


@pytest.mark.parametrize("levels", [1, 3, 8])
def test_yaml_aliases_are_refused_before_any_expansion(levels):
    with pytest.raises(DocumentBoundError, match=r"YAML anchors \(&a0\) are not accepted at line 1"):
        parse_document(alias_bomb(levels))


def test_an_alias_without_its_anchor_and_an_anchor_alone_are_both_refused():
    with pytest.raises(DocumentBoundError, match=r"YAML aliases \(\*x\) are not accepted"):
        parse_document(b"a: *x\n")
    with pytest.raises(DocumentBoundError, match=r"YAML anchors \(&k\) are not accepted"):
        parse_document(b"a: &k {b: 1}\n")
    with pytest.raises(DocumentBoundError, match=r"anchors \(&s\)"):
        parse_document(b"a: &s scalar\n")


def test_yaml_tags_stay_refused():
    with pytest.raises(DocumentError, match="could not determine a constructor"):
        parse_document(b"a: !!python/object:os.system 1\n")


@pytest.mark.parametrize("make", [nested_json, nested_yaml], ids=["json", "yaml"])
def test_nesting_is_bounded_at_max_depth(make):
    # nested_yaml wraps the sequences in one mapping level; nested_json nests mappings only
    inner = MAX_DEPTH - 1 if make is nested_yaml else MAX_DEPTH
    assert parse_document(make(inner))
    with pytest.raises(DocumentBoundError, match=f"nesting deeper than {MAX_DEPTH} levels"):
        parse_document(make(inner + 1))


@pytest.mark.parametrize("make", [nested_json, nested_yaml], ids=["json", "yaml"])
@pytest.mark.parametrize("depth", [1_000, 100_000])
def test_very_deep_nesting_is_a_document_error_not_a_recursion_error(make, depth):
    with pytest.raises(DocumentError, match="nest"):
        parse_document(make(depth))


def test_arrays_nest_under_the_same_bound():
    with pytest.raises(DocumentBoundError, match="nesting deeper"):
        parse_document(b'{"a":' + b"[" * MAX_DEPTH + b"]" * MAX_DEPTH + b"}")


def test_a_lone_surrogate_is_refused_where_jcs_would_fail():
    # JSON may escape one; it is not Unicode text, and the digest (JCS, UTF-8) could not be taken
    with pytest.raises(DocumentError, match=r"\$\.a: string with a lone surrogate"):
        parse_document(b'{"a": "\\ud800"}')
    with pytest.raises(DocumentError, match="key with a lone surrogate"):
        parse_document(b'{"b": {"\\udfff": 1}}')
    assert parse_document(b'{"a": "\\ud83d\\ude00"}') == {"a": "\U0001f600"}  # a pair is a character


def test_size_is_bounded_for_bytes_and_text():
    small = b'{"a": "' + b"x" * 100 + b'"}'
    assert parse_document(small, max_bytes=len(small)) == {"a": "x" * 100}
    with pytest.raises(DocumentBoundError, match=f"{len(small)} bytes is larger than the limit of {len(small) - 1}"):
        parse_document(small, max_bytes=len(small) - 1)
    with pytest.raises(DocumentBoundError, match="larger than the limit"):
        parse_document(small.decode(), max_bytes=len(small) - 1)


def test_passport_files_past_the_cap_are_refused_unread(tmp_path):
    path = tmp_path / "big.json"
    with open(path, "wb") as handle:
        handle.write(b'{"a": "')
        handle.write(b"x" * MAX_DOCUMENT_BYTES)
        handle.write(b'"}')
    with pytest.raises(PassportLoadError, match=f"larger than {MAX_DOCUMENT_BYTES} bytes"):
        load_passport(path)


def test_parse_passport_reports_bounds_as_passport_load_errors():
    with pytest.raises(PassportLoadError, match="anchors"):
        parse_passport(alias_bomb(6))
    with pytest.raises(PassportLoadError, match="nesting deeper"):
        parse_passport(nested_json(10_000))


def test_a_journal_line_nested_past_the_recursion_limit_is_corrupt_not_a_crash(tmp_path):
    path = tmp_path / "j.jsonl"
    path.write_bytes(b"[" * 100_000 + b"\n" + b"{}\n")
    with pytest.raises(CorruptJournalError, match="nested too deeply"):
        recover_journal(path)


# --- the CLI ----------------------------------------------------------------------------------


def _refused(code: int, out: str, err: str, *words: str) -> None:
    assert code == 2, (code, out, err)
    assert "Traceback" not in err and out == ""
    assert len(err.strip().splitlines()) == 1, err
    for word in words:
        assert word in err, err


def process(*argv: str) -> tuple[int, str, str]:
    """The CLI as a real process (bounded: a hang fails the test)."""
    result = subprocess.run([sys.executable, "-m", "governor", *argv], cwd=REPO, capture_output=True, text=True,
                            timeout=CLI_BOUND)
    return result.returncode, result.stdout, result.stderr


@pytest.fixture
def cli(capsys):
    def run(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err
    return run


def test_cli_process_refuses_a_ten_million_alias_passport_with_exit_2(tmp_path):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_bytes(alias_bomb(7))  # 10^7 expansions: past 40 s before
    _refused(*process("passport", "verify", str(bomb)), "YAML anchors (&a0) are not accepted")


def test_cli_process_verify_of_a_100000_level_record_exits_2(tmp_path, keys):
    deep = tmp_path / "deep.json"
    deep.write_bytes(nested_json(100_000))  # a RecursionError traceback and exit 1 before
    _refused(*process("verify", str(deep), "--key", str(keys / "governor-pub.pem")), "nesting deeper")


@pytest.fixture
def keys(tmp_path, capsys):
    assert main(["keygen", "--out", str(tmp_path / "keys")]) == 0
    capsys.readouterr()
    return tmp_path / "keys"


def test_cli_digest_and_sign_refuse_the_bomb(tmp_path, cli, keys):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_bytes(alias_bomb(8))
    _refused(*cli("passport", "digest", str(bomb)), "anchors")
    _refused(*cli("passport", "sign", str(bomb), "--key", str(keys / "governor-key.pem")), "anchors")
    record = tmp_path / "record.json"
    record.write_text("{}")
    _refused(*cli("verify", str(record), "--key", str(keys / "governor-pub.pem"), "--passport", str(bomb)), "anchors")


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_cli_on_100000_levels_exits_2(tmp_path, cli, keys, suffix):
    deep = tmp_path / f"deep{suffix}"
    deep.write_bytes(nested_json(100_000) if suffix == ".json" else nested_yaml(100_000))
    _refused(*cli("passport", "verify", str(deep)), "nest")
    record = tmp_path / "record.json"
    record.write_text("{}")
    _refused(*cli("verify", str(record), "--key", str(keys / "governor-pub.pem"), "--passport", str(deep)), "nest")
    if suffix == ".json":
        _refused(*cli("verify", str(deep), "--key", str(keys / "governor-pub.pem")), "nesting deeper")
        _refused(*cli("verify", str(record), "--did-document", str(deep)), "nesting deeper")
        _refused(*cli("passport", "verify", str(REPO / "policies" / "example-passport.yaml"),
                      "--did-documents", str(deep)), "nesting deeper")


def test_cli_refuses_an_oversized_record_and_key(tmp_path, cli, keys):
    record = tmp_path / "record.json"
    record.write_bytes(b'{"a": "' + b"x" * MAX_DOCUMENT_BYTES + b'"}')
    _refused(*cli("verify", str(record), "--key", str(keys / "governor-pub.pem")),
             f"larger than {MAX_DOCUMENT_BYTES} bytes")
    small = tmp_path / "small.json"
    small.write_text("{}")
    key = tmp_path / "key.pem"
    key.write_bytes(b"x" * (1 << 20))
    _refused(*cli("verify", str(small), "--key", str(key)), "larger than")
