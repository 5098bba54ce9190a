"""The one format of times in records, events and views: ISO 8601 UTC with milliseconds.
Pure (formats the number it is given, reads no clock), so the PDP may use it."""

from __future__ import annotations

import math
from datetime import UTC, datetime


def iso_utc(epoch_seconds: float) -> str:
    """`2026-11-21T22:17:52.123Z`: UTC, millisecond precision (truncated, so never ahead)."""
    total_ms = math.floor(epoch_seconds * 1000)
    moment = datetime.fromtimestamp(total_ms // 1000, tz=UTC)
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{total_ms % 1000:03d}Z"
