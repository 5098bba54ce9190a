"""What the store's end-to-end tests on Redis (failover, cluster) share: a signed passport
with a per-day token cap, which the budget must hold through the store's topology."""

from __future__ import annotations

import json

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.stream_budget_harness import PASSPORT

CAP = 4_000  # tokens per day; a call uses 25 (5 in, 20 out), within what it reserves


def write_passport(path):
    """A passport capped at CAP tokens a day, signed with a fresh key, written to `path`."""
    from governor.passport import sign_passport

    passport = json.loads(json.dumps(PASSPORT))
    passport["permissions"]["resource_limits"]["budget"]["tokens"] = {"per_day": CAP}
    path.write_text(json.dumps(sign_passport(passport, Ed25519PrivateKey.generate())))
    return path
