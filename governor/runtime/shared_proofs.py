"""The proof of a shared session's final record, served by every replica
(docs/reference/shared-sessions.md, "Proofs"; docs/transparency-log.md).

Each replica keeps its own transparency log (`DATA_DIR/log/`), so only the replica that wrote
a final record holds its entry and can make its C2SP tlog-proof. That replica marks the proof
as awaited when it writes the record to the store (`unproved`: session -> the record's
SHA-256, written with the record, only by the record that stands), and publishes the proof
(`prf:<session>`) once a checkpoint of its log holds the entry (a quorum-cosigned one with
witnesses): at once when it is asked for the proof itself, else from its sweeper, within
`--log-checkpoint-seconds` of the end (after a restart too: the marker is in the store). A
proof made against an older checkpoint stays valid, so one published proof serves for good.

Every other replica serves the published proof only after checking it, as `governor verify
--proof` would, against the record in the store and the governor's own key (replicas of one
gateway share it; the checkpoint's origin is the one the proof names) and this replica's
witnesses: a proof edited in the store (another session's, a wrong index, cut short, signed
by another key) is refused as what it is, never served as valid; one without this replica's
witness quorum is not witnessed, as a proof made here would be.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Mapping

from governor.evidence.logproof import verify_logged_record
from governor.evidence.tlog.merkle import ProofError
from governor.evidence.tlog.note import Ed25519Signer, NoteError
from governor.evidence.tlog.proof import parse_proof
from governor.evidence.translog import record_sha256
from governor.evidence.witnessing import NotWitnessed
from governor.store import StoreError

log = logging.getLogger("governor.runtime")


class ProofPending(LookupError):
    """The replica that logged the record has not published its proof yet."""


class ProofNotLogged(LookupError):
    """The record was written by a replica that logged none: there is no proof to serve."""


class ProofInvalid(Exception):
    """The proof in the store does not prove the record in the store (edited or damaged)."""


class ProofStoreUnavailable(Exception):
    """The store did not answer: the published proof cannot be read now."""


def as_logged(record: Mapping[str, Any]) -> dict[str, Any]:
    """The record as a reader of its JSON holds it (what the log hashed: translog.write_record)."""
    return json.loads(json.dumps(record, ensure_ascii=False))


class SharedProofs:
    """Publishes the proofs of the records this replica logged and serves any replica's.
    Blocking (store round trips, a checkpoint signed): called in worker threads."""

    def __init__(self, *, sessions: Any, key: Any, transparency_log: Any = None, witnessing: Any = None) -> None:
        self.sessions = sessions  # governor.store.redis_sessions.RedisSessions
        self.key = key  # the governor's key: a gateway's replicas sign their checkpoints with it
        self.log = transparency_log  # this replica's log (governor.evidence.translog), or None
        self.witnessing = witnessing

    def put_record(self, session: str, record: Mapping[str, Any]) -> bool:
        """Write a final record this replica just wrote (and logged, with a log) to the store,
        its proof marked as awaited when it is the record that stands there."""
        logged = record_sha256(as_logged(record)) if self.log is not None else None
        return self.sessions.put_record(session, dict(record), logged)

    def proof(self, session: str, record: Mapping[str, Any]) -> bytes:
        """The C2SP tlog-proof of `record`, the session's final record: made here when this
        replica's log holds it (then published), else the one published in the store, checked.
        ProofPending, ProofNotLogged, ProofInvalid, ProofStoreUnavailable; NotWitnessed (made
        here: no quorum-cosigned checkpoint holds it in time; published: without the quorum)."""
        if self.log is not None and self.log.index_of(record) is not None:
            proof = self.witnessing.prove(record) if self.witnessing is not None else self.log.prove(record)
            try:
                self.sessions.put_proof(session, proof)
            except StoreError:  # served all the same; the sweeper publishes it later
                log.debug("the proof of session %s could not be published now", session, exc_info=True)
            return proof
        try:
            proof, awaited = self.sessions.get_proof(session)
        except StoreError as exc:
            raise ProofStoreUnavailable(str(exc)) from None
        if proof is None:
            if awaited is not None:
                raise ProofPending(
                    "its record was logged by the replica that wrote it, which publishes the proof once a checkpoint "
                    "of its log holds the entry (within --log-checkpoint-seconds of the end, and a quorum of its "
                    "witnesses' cosignatures when it has witnesses); if this lasts, that replica is not running: "
                    "its next start publishes it")
            raise ProofNotLogged("no proof of it is published and none is awaited: the replica that wrote its final "
                                 "record keeps no transparency log (--log off), or the record in the store is not the "
                                 "one that replica logged")
        self.check(proof, record)
        return proof

    def check(self, proof: bytes, record: Mapping[str, Any]) -> None:
        """ProofInvalid unless `proof` shows `record` in a log signed with the governor's key
        (at the origin its checkpoint names); NotWitnessed unless its checkpoint carries this
        replica's witness quorum (a proof from a replica without witnesses, say)."""
        witnessing = self.witnessing
        try:
            note = parse_proof(proof).checkpoint_note
            origin = note.split(b"\n", 1)[0].decode("utf-8")
            verifier = Ed25519Signer(origin, self.key).verifier()
            if witnessing is None:
                verify_logged_record(record, proof, verifier)
                return
            try:  # one verification when it holds; the failure's cause told apart below
                verify_logged_record(record, proof, verifier, witnesses=[w.key for w in witnessing.witnesses],
                                     quorum=witnessing.quorum)
                return
            except ProofError as exc:
                unwitnessed = exc
            verify_logged_record(record, proof, verifier)  # it holds without them: only the quorum is missing
        except (ProofError, NoteError, ValueError, TypeError, AttributeError, KeyError) as exc:  # (a record edited too)
            raise ProofInvalid(f"the proof in the shared store does not prove the record there ({exc}): it was "
                               "edited or damaged in the store") from None
        raise NotWitnessed(f"the proof published in the shared store does not carry the cosignatures of "
                           f"{witnessing.quorum} of this replica's witnesses ({unwitnessed})")

    def publish(self, *, stopping: bool = False) -> int:
        """From the sweeper: publish the awaited proofs of records this replica's log holds, at a
        checkpoint that holds them (never one made for it: the log's period makes those).
        `stopping`: this replica stops (and may never run on its data directory again): a
        checkpoint is signed now for the entries that wait (with witnesses, only what they
        cosigned is published). How many were published. StoreError: the store did not answer."""
        if self.log is None:
            return 0
        published = 0
        for session, digest in self.sessions.unproved().items():
            index = self.log.by_record.get(digest)
            if index is None:
                continue  # another replica's (or one this log lost: nothing here can prove it)
            if stopping and self.witnessing is None and self.log.checkpoint_size <= index:
                self.log.make_checkpoint()
            at = self._checkpoint_holding(index)
            if at is False:
                continue  # not yet
            try:
                published += self._publish(session, digest, at)
            except StoreError:
                raise
            except Exception:  # one session's trouble (its record edited in the store) stops no other's
                log.exception("session %s: its proof could not be published", session)
        return published

    def _publish(self, session: str, digest: str, at: bytes | None) -> int:
        try:
            record = self.sessions.get_record(session)
        except ValueError:  # edited in the store into something that is not a record
            record = None
        if record is None or record_sha256(record) != digest:
            log.warning("session %s: the record whose proof was awaited is not the one in the store; "
                        "no proof published", session)
            self.sessions.drop_unproved(session)
            return 0
        self.sessions.put_proof(session, self.log.prove(record, at=at))
        return 1

    def _checkpoint_holding(self, index: int) -> bytes | None | bool:
        """The checkpoint to prove entry `index` at: None the log's latest, a cosigned note with
        witnesses; False when none holds it yet."""
        witnessing = self.witnessing
        if witnessing is None:
            return None if self.log.checkpoint_size > index else False
        cosigned = witnessing.cosigned
        if witnessing.compromised or cosigned is None or cosigned.size <= index:
            return False
        return cosigned.note


__all__ = ["ProofInvalid", "ProofNotLogged", "ProofPending", "ProofStoreUnavailable", "SharedProofs", "as_logged"]
