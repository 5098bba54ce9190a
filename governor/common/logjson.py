"""`--log-format json`: one JSON object per log record, one record per line.

Keys: timestamp (ISO 8601, UTC, milliseconds), level, logger, message, then every extra
the log call passed (`log.info(..., extra={"session": s, "cause": c})`; with traces on, the
`trace_id` and `span_id` governor.proxy.tracing put on records), and `exception` with the
traceback when there is one. A value JSON cannot hold is written as its str()."""

from __future__ import annotations

import logging
from datetime import datetime, timezone

import orjson

# attributes every LogRecord has: anything else on a record is an extra
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}


class JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        event = {
            "timestamp": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in event:
                event[key] = value
        if record.exc_info:
            event["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            event["exception"] = record.exc_text
        if record.stack_info:
            event["stack"] = self.formatStack(record.stack_info)
        # newlines inside strings are escaped by JSON: one event stays one line
        return orjson.dumps(event, default=str, option=orjson.OPT_NON_STR_KEYS).decode()
