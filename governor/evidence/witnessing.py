"""The governor's log gets its checkpoints cosigned by its witnesses (c2sp.org/tlog-witness,
docs/transparency-log.md): a background thread submits each new checkpoint to every
witness (`POST /add-checkpoint`, the old size that witness last cosigned and a consistency
proof from it), verifies each cosignature against that witness's key, and keeps the latest
checkpoint that a quorum cosigned. Proofs are made at that checkpoint only: a proof asked
for waits (bounded) for one that holds its record, else `NotWitnessed` (fail closed).

A witness that refuses the checkpoint as a rollback (it cosigned a larger tree than the
log now holds) or a fork (no consistency proof) means the log was replaced or rewritten:
the governor says so at ERROR, and serves no proof from then on (`compromised`).

State: `DATA_DIR/log/witnesses.json`, the size each witness last cosigned (written
durably); a 409 from a witness (its own size) corrects it in any case.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from governor.evidence.record import write_durably
from governor.evidence.tlog.note import NoteError, Signature, Verifier, add_signatures, parse_note
from governor.evidence.tlog.witness import AddCheckpoint
from governor.evidence.translog import TransparencyLog

log = logging.getLogger("governor.evidence.witnessing")

DEFAULT_WAIT_SECONDS = 10.0
REQUEST_TIMEOUT = 5.0
MAX_BACKOFF = 30.0
MAX_ANSWER_BYTES = 64 * 1024


class NotWitnessed(RuntimeError):
    """No checkpoint holding the record carries the quorum of cosignatures (the message says why)."""


@dataclass(frozen=True)
class WitnessEndpoint:
    url: str  # the witness's base URL; `/add-checkpoint` is appended
    key: Verifier  # its cosignature/v1 key (parse_vkey of its vkey)


@dataclass(frozen=True)
class Cosigned:
    size: int
    note: bytes  # the checkpoint with the log's signature and the quorum's cosignatures


class Rejected(Exception):
    """A witness's answer that is evidence against the log (rollback, fork, wrong key)."""


class Witnessing:
    """Gets the log's checkpoints cosigned; thread-safe. `start()` runs the background loop."""

    def __init__(self, translog: TransparencyLog, witnesses: Sequence[WitnessEndpoint], *, quorum: int | None = None,
                 wait_seconds: float = DEFAULT_WAIT_SECONDS, request_timeout: float = REQUEST_TIMEOUT,
                 on_alarm: Callable[[str], None] | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        if not witnesses:
            raise ValueError("witnessing needs at least one witness")
        self.log = translog
        self.witnesses = tuple(witnesses)
        self.quorum = len(self.witnesses) if quorum is None else int(quorum)
        if not 1 <= self.quorum <= len(self.witnesses):
            raise ValueError(f"the witness quorum {self.quorum} is not between 1 and {len(self.witnesses)}")
        self.wait_seconds = float(wait_seconds)
        self.request_timeout = float(request_timeout)
        self.on_alarm = on_alarm
        self.clock = clock
        self.state_path = translog.dir / "witnesses.json"
        self.sizes: dict[str, int] = self._load_sizes()
        self.retry_at: dict[str, float] = {}
        self.backoff: dict[str, float] = {}
        self.held: dict[str, tuple[bytes, Signature]] = {}  # witness -> the note it cosigned last, its line
        self.cosigned: Cosigned | None = None
        self.compromised: str | None = None  # why no proof is served any more
        self.last_problem = ""
        self.changed = threading.Condition()
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None
        self.pool = ThreadPoolExecutor(max_workers=len(self.witnesses), thread_name_prefix="witness")

    # -- state ------------------------------------------------------------------------------

    def _load_sizes(self) -> dict[str, int]:
        try:
            data = json.loads(self.state_path.read_bytes())
            return {str(k): int(v) for k, v in data.get("sizes", {}).items()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            log.warning("witness state %s unreadable (%s): starting from the witnesses' own sizes", self.state_path, exc)
            return {}

    def _save_sizes(self) -> None:
        data = json.dumps({"sizes": self.sizes}, indent=2, sort_keys=True).encode() + b"\n"
        write_durably(self.state_path, data, sync=self.log.sync)

    # -- the loop ---------------------------------------------------------------------------

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="governor-witnessing", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.wake.set()
        if self.thread is not None:
            self.thread.join(timeout=self.request_timeout + 5)
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _run(self) -> None:
        while not self.stopping.is_set():
            self.wake.wait(timeout=0.5)
            self.wake.clear()
            if self.stopping.is_set() or self.compromised:
                continue
            try:
                self.round()
            except Exception:  # the loop must outlive any one round
                log.exception("witnessing round failed")

    def round(self) -> None:
        """Submits the latest checkpoint to the witnesses that have not cosigned it."""
        with self.log.lock:
            note, size = self.log.checkpoint_note, self.log.checkpoint_size
        if self.cosigned is not None and self.cosigned.size >= size:
            return
        now = self.clock()
        signatures = [held[1] for held in self.held.values() if held[0] == note]  # not asked again
        due = [w for w in self.witnesses if self.retry_at.get(w.key.name, 0.0) <= now
               and self.held.get(w.key.name, (b"",))[0] != note]
        if not due:
            return
        answers = list(self.pool.map(lambda w: self._submit(w, note, size), due))
        fresh = False
        for witness, answer in zip(due, answers):
            if isinstance(answer, Signature):
                signatures.append(answer)
                fresh = True
                self.held[witness.key.name] = (note, answer)
                self.sizes[witness.key.name] = size
                self.retry_at.pop(witness.key.name, None)
                self.backoff.pop(witness.key.name, None)
            elif isinstance(answer, Rejected):
                self._alarm(f"witness {witness.key.name} ({witness.url}) refused the log's checkpoint: {answer}")
                return
            else:
                delay = min(MAX_BACKOFF, self.backoff.get(witness.key.name, 0.25) * 2)
                self.backoff[witness.key.name] = delay
                self.retry_at[witness.key.name] = self.clock() + delay
                self.last_problem = f"witness {witness.key.name} ({witness.url}): {answer}"
                log.warning("%s; retrying in %.1fs", self.last_problem, delay)
        if fresh:
            self._save_sizes()
        if len(signatures) >= self.quorum:
            merged = add_signatures(parse_note(note), *signatures).encode()
            with self.changed:
                self.cosigned = Cosigned(size, merged)
                self.changed.notify_all()
            try:
                self.log.add_cosignatures(merged)
            except Exception:  # a newer checkpoint was made meanwhile: the next round cosigns it
                pass

    def _submit(self, witness: WitnessEndpoint, note: bytes, size: int) -> Signature | Rejected | str:
        """One witness's cosignature of `note`, a Rejected, or a transient problem (a string)."""
        old = self.sizes.get(witness.key.name, 0)
        for _ in range(3):  # a 409 tells the witness's size: resubmit once from it
            if old > size:
                return Rejected(f"it has cosigned a tree of {old} entries, and the log now holds {size}: "
                                "a rollback (was DATA_DIR/log replaced by an older copy?)")
            body = AddCheckpoint(old, tuple(self.log.consistency_proof(old, size)) if old else (), note).encode()
            request = urllib.request.Request(witness.url.rstrip("/") + "/add-checkpoint", data=body, method="POST",
                                             headers={"Content-Type": "text/plain"})
            try:
                with urllib.request.urlopen(request, timeout=self.request_timeout) as answer:
                    text = answer.read(MAX_ANSWER_BYTES)
            except urllib.error.HTTPError as answer:
                detail = answer.read(MAX_ANSWER_BYTES).decode("utf-8", "replace").strip()
                if answer.code == 409:
                    try:
                        old = int(detail)
                    except ValueError:
                        return f"a 409 without a size: {detail[:200]!r}"
                    self.sizes[witness.key.name] = old
                    continue
                if answer.code in (403, 404, 422):
                    return Rejected(f"HTTP {answer.code}: {detail[:500]}")
                return f"HTTP {answer.code}: {detail[:200]}"
            except (OSError, ValueError) as exc:  # refused, timed out, reset
                return f"unreachable: {exc}"
            return self._cosignature(witness, note, text)
        return "the witness kept answering 409"

    def _cosignature(self, witness: WitnessEndpoint, note: bytes, text: bytes) -> Signature | str:
        try:
            lines = parse_note(parse_note(note).text.encode("utf-8") + b"\n" + text).signatures
        except (NoteError, UnicodeDecodeError) as exc:
            return f"its answer is not a signature line: {exc}"
        checkpoint_text = parse_note(note).text
        for signature in lines:
            if (signature.name, signature.key_id) == (witness.key.name, witness.key.key_id) and \
                    witness.key.verify(checkpoint_text, signature.signature):
                return signature
        return "its answer carries no cosignature that verifies under its key"

    def _alarm(self, message: str) -> None:
        with self.changed:
            self.compromised = message
            self.changed.notify_all()
        log.error("TRANSPARENCY LOG REFUSED BY A WITNESS: %s. The governor serves no log proof until the log "
                  "is restored (docs/transparency-log.md).", message)
        if self.on_alarm is not None:
            try:
                self.on_alarm(message)
            except Exception:
                log.exception("the witness alarm's callback failed")

    # -- proofs -----------------------------------------------------------------------------

    def prove(self, record: Mapping[str, Any]) -> bytes:
        """A proof of `record` at a quorum-cosigned checkpoint that holds it: waits up to
        `wait_seconds`, else NotWitnessed."""
        index = self.log.index_of(record)
        if index is not None and self.log.checkpoint_size <= index:
            self.log.make_checkpoint()
        self.wake.set()
        deadline = self.clock() + self.wait_seconds
        with self.changed:
            while True:
                if self.compromised:
                    raise NotWitnessed(f"the witnesses refused this log, so it serves no proof: {self.compromised}")
                if index is None or (self.cosigned is not None and self.cosigned.size > index):
                    break
                left = deadline - self.clock()
                if left <= 0:
                    problem = f" (last problem: {self.last_problem})" if self.last_problem else ""
                    raise NotWitnessed(f"the witnesses have not cosigned a checkpoint holding this record within "
                                       f"{self.wait_seconds:g}s: {self.quorum} of {len(self.witnesses)} needed"
                                       f"{problem}")
                self.changed.wait(timeout=min(left, 0.5))
            cosigned = self.cosigned
        return self.log.prove(record, at=cosigned.note if cosigned is not None else None)

    def status(self) -> dict[str, Any]:
        return {"quorum": self.quorum, "witnesses": [w.key.name for w in self.witnesses],
                "cosigned_size": self.cosigned.size if self.cosigned else None, "refused": self.compromised}


__all__ = ["Cosigned", "DEFAULT_WAIT_SECONDS", "NotWitnessed", "WitnessEndpoint", "Witnessing"]
