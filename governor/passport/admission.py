"""Trust §1.1 admission of a passport: the steps, each gating the next, and the pin.

`admit(document, config)` runs 1.1.1 .. 1.1.9 in order and stops at the first
step that fails with severity `block`. Every step reports (section, passed,
severity, message): severity `block` on a clean pass or a blocking failure,
`warn` for a pass that deserves attention, `info` for a step that did not apply.
The report has the shape of the official verify vectors (verified,
public_key_source, blocked_at_section, step outcomes) plus the passport digest,
and, when verified, the pinned passport.

Nothing is fetched and no clock is read here: DID documents and the time come
in with the configuration.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from types import MappingProxyType
from pathlib import Path
from typing import Any, Callable, Mapping
from urllib.parse import unquote, urlsplit

from governor.passport.did import ResolvedDid, did_method, did_web_url, resolve_did_web
from governor.passport.errors import PassportError
from governor.passport.keys import PublicKey, decode_public_key
from governor.passport.loader import first_non_json_value, type_name
from governor.passport.pin import PinnedPassport, passport_digest
from governor.passport.schema import SchemaIssue, check_limits, declares_governance, parse_datetime, validate
from governor.passport.signature import verify_signature

BLOCK = "block"
WARN = "warn"
INFO = "info"

ENFORCE = "enforce"  # production: draft passports are refused
# A record's `limits` member naming a passport admitted without a signature (--allow-unsigned-passport)
UNSIGNED_PASSPORT_MEMBER, UNSIGNED_PASSPORT = "passport_signature", "unsigned"
DEVELOPMENT = "development"  # draft passports are admitted with a warning
MODES = (ENFORCE, DEVELOPMENT)

LOCAL_FILE = "local_file"
DEFAULT_CLOCK_SKEW = timedelta(seconds=300)  # a passport issued further ahead than this is refused
SENSITIVITY_ORDER = ("public", "internal", "confidential", "restricted")

TITLES = {
    "1.1.1": "retrieval provenance",
    "1.1.2": "schema",
    "1.1.3": "identity resolution",
    "1.1.4": "key binding",
    "1.1.5": "signature",
    "1.1.6": "validity period",
    "1.1.7": "lifecycle",
    "1.1.8": "provider",
    "1.1.9": "caller sensitivity",
}


@dataclass(frozen=True, slots=True)
class Retrieval:
    """How the passport reached us (§1.1.1). Any channel but `local_file` is a network
    retrieval and must record its authority (host[:port]) or it has no trust anchor."""

    channel: str = LOCAL_FILE
    authority: str | None = None


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """What the operator decided; `now` is the admission time (aware datetime or epoch seconds).

    trust_on_first_use: an inline key not anchored by a resolved DID is accepted
        (reported as a warning at 1.1.4).
    require_signature: an unsigned passport is refused (otherwise admitted with a
        warning); a signature that is present is always verified.
    did_documents: the local DID map ({DID or did:web URL: DID document}); nothing
        is fetched. A did:web DID is resolved when it is in the map, and must be
        when require_did_resolution is set or trust_on_first_use is off.
    provider_allowlist: host patterns (Core §4.4, `*` within one label); when
        non-empty, provider.url's host must match one.
    require_provider_coherence: provider.url's host must also be the passport
        identity's domain (or a parent of it).
    strict: closed top level (unknown top-level members fail).
    max_clock_skew: how far in the future `security.attestation.issued_at` may lie
        (the issuer's clock running ahead); beyond it the passport is refused at 1.1.6.
    """

    now: datetime | float
    mode: str = ENFORCE
    require_signature: bool = False
    require_did_resolution: bool = False
    trust_on_first_use: bool = True
    did_documents: Mapping[str, Any] = field(default_factory=dict)
    provider_allowlist: tuple[str, ...] = ()
    require_provider_coherence: bool = False
    strict: bool = False
    expiry_warning: timedelta = timedelta(days=30)
    max_clock_skew: timedelta = DEFAULT_CLOCK_SKEW

    def __post_init__(self) -> None:
        now = self.now
        if isinstance(now, (int, float)):
            now = datetime.fromtimestamp(now, tz=timezone.utc)
        if not isinstance(now, datetime) or now.tzinfo is None:
            raise ValueError("AdmissionConfig.now must be a timezone-aware datetime or epoch seconds")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        if not isinstance(self.max_clock_skew, timedelta) or self.max_clock_skew < timedelta(0):
            raise ValueError("AdmissionConfig.max_clock_skew must be a timedelta >= 0")
        object.__setattr__(self, "now", now)
        object.__setattr__(self, "did_documents", MappingProxyType(dict(self.did_documents)))
        object.__setattr__(self, "provider_allowlist", tuple(self.provider_allowlist))


@dataclass(frozen=True, slots=True)
class StepOutcome:
    section: str
    passed: bool
    severity: str  # block | warn | info
    message: str
    issues: tuple[SchemaIssue, ...] = ()

    @property
    def title(self) -> str:
        return TITLES.get(self.section, self.section)

    @property
    def blocks(self) -> bool:
        return not self.passed and self.severity == BLOCK

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "section": self.section, "title": self.title, "passed": self.passed,
            "severity": self.severity, "message": self.message,
        }
        if self.issues:
            data["issues"] = [{"path": i.path, "message": i.message} for i in self.issues]
        return data


@dataclass(frozen=True, slots=True)
class AdmissionReport:
    steps: tuple[StepOutcome, ...]
    verified: bool
    public_key_source: str  # inline_only | did_resolved | cross_checked | none
    blocked_at_section: str | None
    digest: str | None  # None only when the document is not plain JSON
    pinned: PinnedPassport | None = None

    @property
    def warnings(self) -> tuple[StepOutcome, ...]:
        return tuple(step for step in self.steps if step.passed and step.severity == WARN)

    def step(self, section: str) -> StepOutcome | None:
        return next((step for step in self.steps if step.section == section), None)

    @property
    def unsigned(self) -> bool:
        """Admitted without a signature (§1.1.5 passed as a warning: only when signatures are not required)."""
        signature = self.step("1.1.5")
        return signature is not None and signature.passed and signature.severity == WARN

    def to_dict(self) -> dict[str, Any]:
        return {
            "verified": self.verified,
            "public_key_source": self.public_key_source,
            "blocked_at_section": self.blocked_at_section,
            "digest": self.digest,
            "steps": [step.to_dict() for step in self.steps],
        }


def admit(
    document: Any,
    config: AdmissionConfig,
    *,
    retrieval: Retrieval = Retrieval(),
    requesting_agent: Mapping[str, Any] | None = None,
) -> AdmissionReport:
    """Run the Trust §1.1 steps on a loaded passport. Never raises on a bad passport."""
    return _Admission(document, config, retrieval, requesting_agent).run()


class _Admission:
    """One admission: the steps share what earlier steps established (resolved DID, keys)."""

    def __init__(self, document: Any, config: AdmissionConfig, retrieval: Retrieval,
                 requesting_agent: Mapping[str, Any] | None) -> None:
        self.document = document
        self.config = config
        self.retrieval = retrieval
        self.requesting_agent = requesting_agent
        self.resolved: ResolvedDid | None = None
        self.keys: tuple[PublicKey, ...] = ()
        self.key_source = "none"

    def run(self) -> AdmissionReport:
        steps: list[StepOutcome] = []
        blocked: str | None = None
        checks: tuple[tuple[str, Callable[[], tuple[bool, str, str] | StepOutcome]], ...] = (
            ("1.1.1", self.retrieval_provenance),
            ("1.1.2", self.schema),
            ("1.1.3", self.identity),
            ("1.1.4", self.key_binding),
            ("1.1.5", self.signature),
            ("1.1.6", self.validity),
            ("1.1.7", self.lifecycle),
            ("1.1.8", self.provider),
            ("1.1.9", self.caller_sensitivity),
        )
        for section, check in checks:
            result = check()
            outcome = result if isinstance(result, StepOutcome) else StepOutcome(section, *result)
            steps.append(outcome)
            if outcome.blocks:
                blocked = section
                break
        verified = blocked is None
        pinned = PinnedPassport(self.document) if verified else None
        if pinned:
            digest: str | None = pinned.digest
        elif isinstance(self.document, Mapping) and not first_non_json_value(self.document):
            digest = passport_digest(self.document)
        else:
            digest = None
        # key_source is only set once 1.1.4 has bound a key, so a passport blocked earlier reports none
        return AdmissionReport(tuple(steps), verified, self.key_source, blocked, digest, pinned)

    # --- 1.1.1 ------------------------------------------------------------------------------

    def retrieval_provenance(self) -> tuple[bool, str, str]:
        channel, authority = self.retrieval.channel, self.retrieval.authority
        if channel == LOCAL_FILE:
            return True, WARN, "loaded from a local file: provenance recorded, no transport security"
        if not authority:
            return False, BLOCK, f"retrieved over {channel!r} without a recorded authority: no trust anchor"
        domain = identity_domain(self.document) if isinstance(self.document, Mapping) else None
        host = authority.rsplit("@", 1)[-1].split(":", 1)[0].lower()
        if domain and host == domain:
            return True, BLOCK, f"retrieved over {channel!r} from {authority}, the passport's own domain"
        return True, WARN, (
            f"retrieved over {channel!r} from {authority}, which is not the passport's identity domain "
            f"({domain or 'none declared'})"
        )

    # --- 1.1.2 ------------------------------------------------------------------------------

    def schema(self) -> StepOutcome:
        document = self.document
        if not isinstance(document, Mapping):
            return StepOutcome("1.1.2", False, BLOCK, f"a passport is a JSON object, not a {type_name(document)}")
        problem = first_non_json_value(document)
        if problem:
            return StepOutcome("1.1.2", False, BLOCK, "not plain JSON", (SchemaIssue("$", problem),))
        issues = validate(document, strict=self.config.strict) or check_limits(document)
        if issues:
            count = f"{len(issues)} problem{'s' if len(issues) > 1 else ''}"
            return StepOutcome("1.1.2", False, BLOCK, f"{count} against the ADL schema", tuple(issues))
        mode = "strict" if self.config.strict else "open"
        profile = " with the governance profile" if declares_governance(document) else ""
        return StepOutcome("1.1.2", True, BLOCK, f"valid ADL document ({mode} schema{profile})")

    # --- 1.1.3 ------------------------------------------------------------------------------

    def identity(self) -> tuple[bool, str, str]:
        did = declared_did(self.document)
        config = self.config
        if did is None:
            if config.require_did_resolution:
                return False, BLOCK, "DID resolution is required but the passport declares no DID"
            return True, INFO, "no DID declared"
        method = did_method(did)
        if method != "web":
            shown = f"DID method {method!r}" if method else f"{did!r} (not a DID)"
            return False, BLOCK, f"{shown} is not supported: only did:web is resolved"
        must = config.require_did_resolution or not config.trust_on_first_use
        try:
            url = did_web_url(did)
            if not must and did not in config.did_documents and url not in config.did_documents:
                return True, INFO, f"{did} not resolved (no local DID document; resolution not required)"
            self.resolved = resolve_did_web(did, config.did_documents)
        except PassportError as exc:
            if must:
                return False, BLOCK, str(exc)
            return True, WARN, f"{exc}; continuing on trust on first use"
        methods = ", ".join(method_id for method_id, _ in self.resolved.keys)
        return True, BLOCK, f"resolved {did} from the local document for {self.resolved.url} ({methods})"

    # --- 1.1.4 ------------------------------------------------------------------------------

    def key_binding(self) -> tuple[bool, str, str]:
        inline_member = _get(self.document, "cryptographic_identity", "public_key")
        inline: PublicKey | None = None
        if inline_member is not None:
            try:
                inline = decode_public_key(inline_member.get("algorithm"), inline_member.get("value"))
            except PassportError as exc:
                if self._signature() is not None or self.config.require_signature:
                    return False, BLOCK, f"inline public key refused: {exc}"
                return True, WARN, f"inline public key unusable ({exc}); the passport is unsigned, so it is not used"
        if self.resolved:
            if inline is None:
                self.keys = tuple(key for _, key in self.resolved.keys)
                self.key_source = "did_resolved"
                return True, BLOCK, "no inline key: using the DID document's assertion key"
            match = next((mid for mid, key in self.resolved.keys if key.same_key(inline)), None)
            if match is None:
                return False, BLOCK, "the inline public key is not among the DID document's assertion keys"
            self.keys, self.key_source = (inline,), "cross_checked"
            return True, BLOCK, f"inline public key matches {match}"
        if inline is None:
            return True, INFO, "no public key declared"
        if not self.config.trust_on_first_use:
            return False, BLOCK, "inline public key is not anchored by a resolved DID and trust on first use is off"
        self.keys, self.key_source = (inline,), "inline_only"
        return True, WARN, f"inline {inline.algorithm} key only, not anchored by a DID: trusted on first use"

    # --- 1.1.5 ------------------------------------------------------------------------------

    def signature(self) -> tuple[bool, str, str]:
        signature = self._signature()
        if signature is None:
            if self.config.require_signature:
                return False, BLOCK, "no security.attestation.signature, and signatures are required"
            return True, WARN, "unsigned: integrity and origin are not established"
        if not self.keys:
            return False, BLOCK, "signed, but there is no usable public key to verify with"
        failure = ""
        for key in self.keys:
            try:
                verify_signature(self.document, signature, key)
            except PassportError as exc:
                failure = str(exc)
                continue
            covered = "SHA-256 digest of the canonical bytes" if signature.get("signed_content") == "digest" \
                else "canonical bytes"
            return True, BLOCK, f"{key.algorithm} signature over the {covered} verifies ({self.key_source} key)"
        return False, BLOCK, failure

    # --- 1.1.6 ------------------------------------------------------------------------------

    def validity(self) -> tuple[bool, str, str]:
        now = self.config.now
        assert isinstance(now, datetime)  # normalized by AdmissionConfig
        issued_text = _get(self.document, "security", "attestation", "issued_at")
        if issued_text is not None:
            issued = parse_datetime(issued_text)
            if issued is None:
                return False, BLOCK, f"issued_at {issued_text!r} is not an RFC 3339 date-time"
            skew = self.config.max_clock_skew
            if issued > now + skew:
                return False, BLOCK, (
                    f"issued in the future: issued_at {issued_text} is {_duration(issued - now)} after the "
                    f"admission time, beyond the allowed clock skew of {_duration(skew)}"
                )
        expires_text = _get(self.document, "security", "attestation", "expires_at")
        if expires_text is None:
            return True, INFO, "no expiry declared"
        expires = parse_datetime(expires_text)
        if expires is None:
            return False, BLOCK, f"expires_at {expires_text!r} is not an RFC 3339 date-time"
        if expires <= now:
            return False, BLOCK, f"attestation expired at {expires_text}"
        if expires - now <= self.config.expiry_warning:
            days = (expires - now).days
            return True, WARN, f"attestation expires soon: {expires_text} (in {days} day{'s' if days != 1 else ''})"
        return True, BLOCK, f"attestation valid until {expires_text}"

    # --- 1.1.7 ------------------------------------------------------------------------------

    def lifecycle(self) -> tuple[bool, str, str]:
        lifecycle = _get(self.document, "lifecycle") or {}
        status = lifecycle.get("status")
        successor = f"; successor: {lifecycle['successor']}" if lifecycle.get("successor") else ""
        if status is None:
            return True, INFO, "no lifecycle status declared"
        if status == "retired":
            return False, BLOCK, f"the agent is retired{successor}"
        if status == "deprecated":
            sunset = f"; sunset: {lifecycle['sunset_date']}" if lifecycle.get("sunset_date") else ""
            return True, WARN, f"the agent is deprecated{sunset}{successor}"
        if status == "draft":
            if self.config.mode == ENFORCE:
                return False, BLOCK, "draft passports are not admitted in enforce mode"
            return True, WARN, f"draft passport admitted ({self.config.mode} mode)"
        return True, BLOCK, f"lifecycle status {status}"

    # --- 1.1.8 ------------------------------------------------------------------------------

    def provider(self) -> tuple[bool, str, str]:
        config = self.config
        if not config.require_provider_coherence and not config.provider_allowlist:
            return True, INFO, "provider not checked (no allowlist, coherence not required)"
        url = _get(self.document, "provider", "url")
        host = (urlsplit(url).hostname or "") if isinstance(url, str) else ""
        if not host:
            return False, BLOCK, "provider.url with a host is needed to check the provider"
        if config.require_provider_coherence:
            domain = identity_domain(self.document)
            if domain is None:
                return False, BLOCK, "the passport identity has no domain to check the provider against"
            if domain != host and not domain.endswith("." + host):
                return False, BLOCK, f"provider host {host} does not match the identity domain {domain}"
        if config.provider_allowlist and not any(host_matches(p, host) for p in config.provider_allowlist):
            return False, BLOCK, f"provider host {host} is not on the provider allowlist"
        return True, BLOCK, f"provider host {host} accepted"

    # --- 1.1.9 ------------------------------------------------------------------------------

    def caller_sensitivity(self) -> tuple[bool, str, str]:
        if self.requesting_agent is None:
            return True, INFO, "no requesting agent"
        target = _get(self.document, "data_classification", "sensitivity")
        caller = _get(self.requesting_agent, "data_classification", "sensitivity")
        if caller not in SENSITIVITY_ORDER:
            return False, BLOCK, "the requesting agent declares no valid data_classification.sensitivity"
        if SENSITIVITY_ORDER.index(caller) < SENSITIVITY_ORDER.index(target):
            return False, BLOCK, f"requesting agent is cleared for {caller} data, this agent handles {target}"
        return True, BLOCK, f"requesting agent ({caller}) is cleared for {target} data"

    def _signature(self) -> Mapping[str, Any] | None:
        signature = _get(self.document, "security", "attestation", "signature")
        return signature if isinstance(signature, Mapping) else None


# --- helpers ---------------------------------------------------------------------------------


def declared_did(document: Mapping[str, Any]) -> str | None:
    """cryptographic_identity.did, else the id when it is a DID."""
    did = _get(document, "cryptographic_identity", "did")
    if isinstance(did, str):
        return did
    identifier = document.get("id")
    return identifier if isinstance(identifier, str) and identifier.startswith("did:") else None


def identity_domain(document: Mapping[str, Any]) -> str | None:
    """The domain the passport's identity names: the https id's host, or the did:web domain."""
    identifier = document.get("id")
    if isinstance(identifier, str) and identifier.startswith(("https://", "http://")):
        return urlsplit(identifier).hostname
    for candidate in (identifier, _get(document, "cryptographic_identity", "did")):
        if isinstance(candidate, str) and did_method(candidate) == "web":
            return unquote(candidate[len("did:web:"):].split(":", 1)[0]).split(":", 1)[0].lower()
    return None


def host_matches(pattern: str, host: str) -> bool:
    """Core §4.4 host glob: `*` is any run of characters within one label."""
    regex = "".join("[^.]*" if part == "*" else re.escape(part) for part in re.split(r"(\*)", pattern.lower()))
    return re.fullmatch(regex, host.lower()) is not None


def _duration(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    if seconds < 3 * 86400:
        return f"{seconds} s"
    return f"{seconds // 86400} days"


def _get(document: Any, *path: str) -> Any:
    value = document
    for name in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(name)
    return value


def format_report(path: Path | str, report: AdmissionReport) -> str:
    """The report as `governor passport verify` and `governor run` print it: one line a step."""
    lines = [f"passport {path}"]
    for step in report.steps:
        mark = "ok  " if step.passed else "FAIL"
        lines.append(f"  {mark} {step.section} {step.title:<20} [{step.severity:<5}] {step.message}")
        lines.extend(f"         {issue}" for issue in step.issues)
    verdict = "ADMITTED" if report.verified else f"REJECTED at {report.blocked_at_section}"
    warnings = len(report.warnings)
    if report.verified and warnings:
        verdict += f" with {warnings} warning{'s' if warnings > 1 else ''}"
    lines.append(f"{verdict}; public key source: {report.public_key_source}")
    lines.append(f"digest: {report.digest}")
    return "\n".join(lines)
