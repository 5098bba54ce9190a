"""The Redis store's URLs and the client each one opens.

  redis://[user:password@]HOST:PORT/DB          one primary (rediss:// for TLS)
  redis+sentinel://[user:password@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB]
                                                the primary that Sentinel names for SERVICE,
                                                found again after a failover (rediss+sentinel://)
  redis+cluster://[user:password@]HOST:PORT[,HOST:PORT...]
                                                Redis Cluster (rediss+cluster://): a plain client
                                                to the primary owning the store's one slot,
                                                found again after a failover (redis_slot)

Options the governor reads (in the query string, any scheme):
  timeout=SECONDS       socket timeout of every command (default 2): past it the step is
                        refused as retryable, never halted
  retry_after=SECONDS   the Retry-After of that refusal (default 1)
  wait=N                each reservation is acknowledged by N replicas (Redis WAIT) before
                        the step goes ahead; fewer within wait_timeout refuses it (retryable).
                        On Cluster too: WAIT runs on the slot owner's connection.
  wait_timeout=SECONDS  how long WAIT waits (default 0.5; added to timeout for the reply)
  sentinel_password=P   the Sentinels' own password (the userinfo one is the primary's)
  prefix=PREFIX         key prefix (default governor:; on Cluster wrapped in a hash tag,
                        {governor}:, so every key of the store shares one slot and the
                        atomic scripts run there)
TLS (the rediss schemes only; every connection: the primary's, the Sentinels', each Cluster
node's; checked when the store opens, governor.store.redis_tls):
  ssl_ca_certs=PATH     the CA bundle (PEM) the servers' certificates must chain to (default:
                        the system's trusted CAs)
  ssl_ca_path=DIR       a directory of CA certificates, likewise
  ssl_certfile=PATH     the client certificate (PEM) presented to servers that ask for one
  ssl_keyfile=PATH      its private key (when not in ssl_certfile)
  ssl_check_hostname=true|false
                        whether the certificate must name the address dialled (default true;
                        Sentinel and Cluster name their nodes by IP address)
Any other query option is redis-py's own (redis://, rediss:// only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import parse_qs, unquote, urlencode

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from governor.store.redis_tls import TLS_OPTIONS, tls_settings

SCHEMES = ("redis://", "rediss://", "redis+sentinel://", "rediss+sentinel://", "redis+cluster://",
           "rediss+cluster://")
_OURS = ("timeout", "retry_after", "wait", "wait_timeout", "sentinel_password", "prefix", "sessions", "ended_ttl")


@dataclass(frozen=True, slots=True)
class RedisOptions:
    kind: str = "redis"  # redis | sentinel | cluster
    timeout: float = 2.0
    retry_after: float = 1.0
    wait_replicas: int = 0
    wait_timeout: float = 0.5
    prefix: str = "governor:"
    # shared (default): replicas share sessions (governor.store.redis_sessions); local: each
    # process keeps its own sessions and shares budgets only, with the model call's one-round-trip path
    sessions: str = "shared"
    # how long what a shared session leaves in Redis (chain, state, record, book entries) is kept
    # after its record was written (governor.store.redis_retention)
    ended_ttl: float = 86400.0
    # redis-py's ssl_* arguments of every connection (rediss schemes; governor.store.redis_tls)
    tls: tuple[tuple[str, str | bool], ...] = ()


def parse_options(url: str) -> tuple[str, RedisOptions, dict[str, str]]:
    """The URL without the governor's options, those options, and the redis-py ones left."""
    base, _, query = url.partition("?")
    if not base.startswith(SCHEMES):
        raise ValueError(f"{_safe(url)}: unknown store scheme (expected one of {', '.join(SCHEMES)})")
    scheme = base.partition("://")[0]
    kind = "sentinel" if scheme.endswith("+sentinel") else "cluster" if scheme.endswith("+cluster") else "redis"
    raw = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
    ours = {k: raw.pop(k) for k in _OURS if k in raw}
    tls = tls_settings(_safe(url), scheme.startswith("rediss"), {k: raw.pop(k) for k in TLS_OPTIONS if k in raw})
    if kind != "redis" and raw:
        raise ValueError(f"{_safe(url)}: unknown option(s) {', '.join(sorted(raw))}")
    wait = ours.get("wait", "0")
    if not wait.isdigit() or int(wait) > 64:
        raise ValueError(f"{_safe(url)}: wait must be a number of replicas (0-64), got {wait!r}")
    prefix = ours.get("prefix", "governor:")
    if not prefix or "{" in prefix or "}" in prefix:
        raise ValueError(f"{_safe(url)}: prefix must be non-empty and without braces, got {prefix!r}")
    if kind == "cluster":
        prefix = "{" + prefix.rstrip(":") + "}:"
    sessions = ours.get("sessions", "shared")
    if sessions not in ("shared", "local"):
        raise ValueError(f"{_safe(url)}: sessions must be shared or local, got {sessions!r}")
    options = RedisOptions(
        kind=kind,
        sessions=sessions,
        timeout=_seconds(url, "timeout", ours.get("timeout", "2")),
        retry_after=_seconds(url, "retry_after", ours.get("retry_after", "1")),
        wait_replicas=int(wait),
        wait_timeout=_seconds(url, "wait_timeout", ours.get("wait_timeout", "0.5")),
        prefix=prefix,
        ended_ttl=_seconds(url, "ended_ttl", ours.get("ended_ttl", "86400")),
        tls=tuple(tls.items()),
    )
    rest = base + ("?" + urlencode(raw) if raw else "")
    return rest, options, {"sentinel_password": ours["sentinel_password"]} if "sentinel_password" in ours else {}


def make_client(url: str, options: RedisOptions, extra: dict[str, str],
                on_connect: Callable[[Any], Any] | None = None, *, asynchronous: bool = False) -> Any:
    """The redis-py client for `url` (stripped of the governor's options); with `asynchronous`,
    its redis.asyncio twin (the per-step path on the event loop; `on_connect` a coroutine)."""
    # a reservation waits for its replicas on top of the command itself
    common: dict[str, Any] = dict(socket_timeout=options.timeout + (options.wait_timeout if options.wait_replicas else 0),
                                  socket_connect_timeout=options.timeout, decode_responses=True)
    tls_options = dict(options.tls)  # empty without TLS (parse_options refuses them on plain schemes)
    if asynchronous:
        import redis.asyncio as flavour
        from redis.asyncio.retry import Retry as FlavourRetry
    else:
        flavour, FlavourRetry = redis, Retry  # type: ignore[assignment]
    if options.kind == "redis":
        return flavour.Redis.from_url(url, retry=FlavourRetry(NoBackoff(), 0), redis_connect_func=on_connect,
                                      **common, **tls_options)
    scheme, _, rest = url.partition("://")
    netloc, _, path = rest.partition("/")
    userinfo, _, hosts = netloc.rpartition("@")
    username, _, password = userinfo.partition(":") if userinfo else ("", "", "")
    auth = {"username": unquote(username) or None, "password": unquote(password) or None}
    nodes = [_host_port(url, h) for h in hosts.split(",") if h]
    if not nodes:
        raise ValueError(f"{_safe(url)}: no HOST:PORT")
    tls = {"ssl": True, **tls_options} if scheme.startswith("rediss") else {}
    if options.kind == "cluster":
        if path.strip("/"):
            raise ValueError(f"{_safe(url)}: Redis Cluster has no databases (no /DB)")
        # not redis-py's RedisCluster: every key of the store is in one slot, so a plain
        # client to the slot's owner (governor.store.redis_slot) serves it, WAIT included
        from governor.store.redis_slot import SlotMap, slot_owner_client
        connect = {**auth, **common, **tls_options}  # every node's connections: the look-ups' and the owner's
        # each client its own map of the slot (an address, asked again when stale)
        slot_map = SlotMap(nodes, f"{options.prefix}fence", connect, tls=bool(tls))
        if asynchronous:
            from governor.store.redis_slot_async import async_slot_owner_client
            return async_slot_owner_client(slot_map, connect=connect, on_connect=on_connect)
        return slot_owner_client(slot_map, connect=connect, on_connect=on_connect)
    if asynchronous:
        from redis.asyncio.sentinel import Sentinel
    else:
        # redis-py's, naming each Sentinel's own error when none names the primary
        from governor.store.redis_sentinel import ExplainedSentinel as Sentinel  # type: ignore[assignment]
    parts = [p for p in path.split("/") if p]
    if not parts or len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
        raise ValueError(f"{_safe(url)}: expected redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE[/DB]")
    service, db = unquote(parts[0]), int(parts[1]) if len(parts) == 2 else 0
    sentinel_kwargs = dict(socket_timeout=options.timeout, socket_connect_timeout=options.timeout, **tls)
    if "sentinel_password" in extra:
        sentinel_kwargs["password"] = extra["sentinel_password"]
    sentinel = Sentinel(nodes, sentinel_kwargs=sentinel_kwargs)
    return sentinel.master_for(service, db=db, retry=FlavourRetry(NoBackoff(), 0), redis_connect_func=on_connect,
                               **auth, **tls, **common)


def _host_port(url: str, item: str) -> tuple[str, int]:
    host, _, port = item.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"{_safe(url)}: expected HOST:PORT, got {item!r}")
    return host.strip("[]"), int(port)


def _seconds(url: str, name: str, value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"{_safe(url)}: {name} must be a positive number of seconds, got {value!r}")
    return seconds


def _safe(url: str) -> str:
    """The URL for an error message, without its password."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, hosts = rest.partition("@")
    return f"{scheme}{sep}***@{hosts}" if at else url
