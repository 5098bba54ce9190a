"""redis-py's Sentinel client, whose "no master found" names why each Sentinel failed.

redis-py 8 reports a Sentinel it could not ask by its client's repr and the error's class
alone (`- network:ConnectionError`), so a certificate the Sentinel's TLS could not verify,
a refused client certificate or a wrong password read the same. When no Sentinel names the
primary, each one that failed is asked once more on a connection of its own, without
redis-py's retries, and what it answered is named. Only then: the usual discovery is
redis-py's, unchanged."""

from __future__ import annotations

from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import MasterNotFoundError, Sentinel


class ExplainedSentinel(Sentinel):
    def discover_master(self, service_name: str) -> Any:
        try:
            return super().discover_master(service_name)
        except MasterNotFoundError as exc:
            reasons = [reason for sentinel in self.sentinels if (reason := _why(sentinel)) is not None]
            if not reasons:
                raise
            raise MasterNotFoundError(f"No master found for {service_name!r}: {'; '.join(reasons)}") from exc


def _why(sentinel: redis.Redis) -> str | None:
    """Why `sentinel` cannot be asked (None: it answers)."""
    pool = sentinel.connection_pool
    kwargs = {**pool.connection_kwargs, "retry": Retry(NoBackoff(), 0)}
    connection = pool.connection_class(**kwargs)
    try:
        connection.connect()
        connection.send_command("PING")
        connection.read_response()
        return None
    except redis.RedisError as exc:
        return f"Sentinel {kwargs.get('host')}:{kwargs.get('port')}: {type(exc).__name__}: {exc}"
    finally:
        connection.disconnect()
