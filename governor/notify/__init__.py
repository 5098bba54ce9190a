"""Notifications: signed webhooks for what a human should know now (a review waiting, a
halt, an agent lock, a budget past its warning threshold).

`signing` signs and verifies (no I/O: a receiver imports it alone); `events` builds the
payloads (pure); `webhooks` delivers them from background tasks with bounded queues, so
enforcement never waits on a receiver.
"""

from governor.notify.signing import SignatureError, sign, verify

__all__ = ["SignatureError", "sign", "verify"]
