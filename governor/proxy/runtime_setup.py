"""The real runtime `serve` builds from the settings when it is handed none: the passport
admitted and pinned, the policy compiled, the store, the key, the transparency log and its
witnesses (StartupError, saying which and why, when one of them cannot be had)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

from governor.proxy.settings import Settings, StartupError
from governor.runtime.api import RuntimeAPI

log = logging.getLogger("governor.proxy")


def witness_alarm(runtime: Any) -> Any:
    """What a witness's rollback or fork refusal does besides its ERROR line: the metric, and
    an event in the audit journal (from the witnessing thread, on the runtime's loop)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None

    def alarm(message: str) -> None:
        runtime.metrics.witness_refusals.inc()
        if loop is not None and not loop.is_closed():
            detail = {"refused_by_witness": message,
                      "effect": "no transparency-log proof is served until the log is restored"}
            asyncio.run_coroutine_threadsafe(runtime.audit.record_audit("on_governor_log_refused", "halt", detail), loop)

    return alarm


def build_runtime(settings: Settings, metrics: Any = None) -> RuntimeAPI:
    """The real runtime: the passport admitted and pinned, the policy compiled, SQLite state
    (or settings.store), the governor's key in the data directory (created on first run).
    Refuses (StartupError, with the admission report) a passport that fails admission."""
    from datetime import datetime, timezone

    from governor.evidence import EvidenceError, ensure_governor_key
    from governor.passport import (
        UNSIGNED_PASSPORT,
        UNSIGNED_PASSPORT_MEMBER,
        AdmissionConfig,
        PassportError,
        admit,
        example_passport_path,
        load_passport,
    )
    from governor.policy import compile_limits
    from governor.policy.causes import canonical_cause
    from governor.runtime.prices import price_book
    from governor.runtime.core import Runtime
    from governor.runtime.duplicates import watch_duplicates
    from governor.store import open_store, redacted

    path = settings.passport or example_passport_path()
    try:
        document = load_passport(path)
    except PassportError as exc:
        raise StartupError(f"passport {path}: {exc}") from None
    report = admit(document, AdmissionConfig(now=datetime.now(timezone.utc),
                                             require_signature=not settings.allow_unsigned_passport))
    if not report.verified or report.pinned is None:
        unsigned = report.blocked_at_section == "1.1.5" and "no security.attestation.signature" in \
            (report.step("1.1.5").message if report.step("1.1.5") else "")
        hint = " (unsigned: sign it with `governor passport sign`, or admit it with --allow-unsigned-passport)" \
            if unsigned else ""
        raise StartupError(f"passport {path} refused at admission{hint}", report)
    pricing = settings.pricing or "genai-prices and the bundled overrides"
    try:  # genai-prices, under the bundled overrides, under the operator's (governor.runtime.prices)
        limits = compile_limits(report.pinned.document, tier=settings.tier, pricing=price_book(settings.pricing),
                                passport_digest=report.digest)
    except Exception as exc:  # LimitsError, PricingError: say which file and why
        raise StartupError(f"cannot compile the limits of {path} (pricing {pricing}): {exc}") from None
    from governor.policy.degradation import legacy_degradation_names

    for old in legacy_degradation_names(report.pinned.document.get("runtime")):
        log.warning("passport %s: runtime.degradation.%s is a deprecated cause name: it is read as %s "
                    "(docs/reference/deciding.md)", path, old, canonical_cause(old))
    if report.unsigned:  # only with allow_unsigned_passport: the fail-open override is in every record's header
        log.warning("passport %s is UNSIGNED, admitted by --allow-unsigned-passport: every record names it "
                    "(limits.%s)", path, UNSIGNED_PASSPORT_MEMBER)
        limits = dataclasses.replace(limits, summary={**limits.summary, UNSIGNED_PASSPORT_MEMBER: UNSIGNED_PASSPORT})
    from governor.runtime.resume import archive_passport

    try:  # a session admitted with this passport keeps its limits across a restart with another
        archive_passport(settings.data_dir, report.digest, report.pinned.canonical_bytes)
    except OSError as exc:
        raise StartupError(f"cannot archive the admitted passport in {settings.data_dir}: {exc}") from None
    try:  # <data-dir>/keys: private key (0600), public key, did.json for auditors (§8.2)
        key, governor_id = ensure_governor_key(settings.data_dir, settings.governor_id)
    except (EvidenceError, OSError, ValueError) as exc:
        raise StartupError(f"governor key in {settings.data_dir / 'keys'}: {exc}") from None
    location = settings.store or settings.data_dir / "state.db"
    try:
        store = open_store(location)
    except Exception as exc:  # StoreError, a bad URL: nothing can be decided without state
        raise StartupError(f"state store {redacted(location)}: {exc}") from None
    transparency_log = None
    if settings.log:
        from governor.evidence.translog import LogError, TransparencyLog, default_origin

        origin = settings.log_origin or default_origin(governor_id)
        if settings.worker is not None:  # each worker its own log (its own data directory): its own origin
            origin = f"{origin}/worker-{settings.worker}"
        try:  # before the runtime finalizes what a stop left: a record logged but not in place is put there
            transparency_log = TransparencyLog(
                settings.data_dir, key, origin,
                checkpoint_entries=settings.log_checkpoint_entries,
                checkpoint_seconds=settings.log_checkpoint_seconds)
        except (LogError, EvidenceError, OSError, ValueError) as exc:
            raise StartupError(f"transparency log in {settings.data_dir / 'log'}: {exc}") from None
    witnessing = None
    if settings.witnesses:
        from governor.evidence.tlog.note import NoteError, parse_vkey
        from governor.evidence.witnessing import WitnessEndpoint, Witnessing

        if transparency_log is None:
            raise StartupError("--witness needs the transparency log (--log on)")
        try:
            witnessing = Witnessing(transparency_log, [WitnessEndpoint(url, parse_vkey(vkey))
                                                       for url, vkey in settings.witnesses],
                                    quorum=settings.witness_quorum, wait_seconds=settings.witness_wait)
        except (NoteError, ValueError) as exc:
            raise StartupError(f"--witness: {exc}") from None
    runtime = Runtime(limits=limits, store=store, data_dir=settings.data_dir, key=key,
                      governor_id=governor_id, agent_id=report.pinned.id or report.pinned.name, metrics=metrics,
                      session_idle_sec=settings.session_idle, pinned=report.pinned, owns_store=True,
                      persona_idle_sec=settings.persona_idle, transparency_log=transparency_log,
                      witnessing=witnessing)
    runtime.admission = report  # shown at startup: warnings such as trust on first use
    runtime.limit_rates(settings.rate_limits)
    runtime.settings.duplicates = watch_duplicates(store, governor_id=governor_id, public_key=key.public_key(),
                                                   log_origin=transparency_log and transparency_log.origin,
                                                   agent=runtime.agent_id, metrics=metrics)
    if settings.envelope is not None:
        runtime.envelope.config = settings.envelope
    runtime.start()
    if witnessing is not None:
        witnessing.on_alarm = witness_alarm(runtime)
        witnessing.start()
    return runtime
