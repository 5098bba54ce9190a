"""The Redis store's TLS options (rediss://, rediss+sentinel://, rediss+cluster://), checked
when the URL is read so that a wrong path or a file that is no certificate is named at
start, not found by the first connection.

The options are redis-py's own ssl_* arguments, given to every connection the store opens:
the primary's, the Sentinels' and each Cluster node's (the slot map's look-ups and the slot
owner's connections, governor.store.redis_slot). The server's certificate is always verified
(redis-py's ssl_cert_reqs=required): against ssl_ca_certs / ssl_ca_path when given, else the
system's trusted CAs; and it must name the address dialled unless ssl_check_hostname=false
(Sentinel and Cluster name their nodes by IP address, so those nodes' certificates need the
IP in their subjectAltName)."""

from __future__ import annotations

import os
import ssl
from contextlib import contextmanager
from typing import Iterator

import redis

# option -> what its value is
TLS_OPTIONS = {
    "ssl_ca_certs": "file",
    "ssl_ca_path": "directory",
    "ssl_certfile": "file",
    "ssl_keyfile": "file",
    "ssl_check_hostname": "boolean",
}


def tls_settings(url: str, tls: bool, raw: dict[str, str]) -> dict[str, str | bool]:
    """redis-py's ssl_* arguments from the URL's TLS options `raw` (`url` for messages, its
    password hidden; `tls`: the scheme is a rediss one). ValueError names what is wrong."""
    if not raw:
        return {}
    if not tls:
        raise ValueError(f"{url}: {', '.join(sorted(raw))} need(s) TLS: use rediss://, rediss+sentinel:// or "
                         "rediss+cluster://")
    settings: dict[str, str | bool] = {}
    for name, value in raw.items():
        kind = TLS_OPTIONS[name]
        if kind == "boolean":
            if value.lower() not in ("true", "false"):
                raise ValueError(f"{url}: {name} must be true or false, got {value!r}")
            settings[name] = value.lower() == "true"
        elif kind == "directory":
            if not os.path.isdir(value):
                raise ValueError(f"{url}: {name}: no such directory {value!r}")
            settings[name] = value
        else:
            if not os.path.isfile(value):
                raise ValueError(f"{url}: {name}: no such file {value!r}")
            if not os.access(value, os.R_OK):
                raise ValueError(f"{url}: {name}: {value!r} is not readable")
            settings[name] = value
    if "ssl_keyfile" in settings and "ssl_certfile" not in settings:
        raise ValueError(f"{url}: ssl_keyfile needs ssl_certfile (the certificate the key belongs to)")
    _load(url, settings)
    return settings


def _load(url: str, settings: dict[str, str | bool]) -> None:
    """Load the files as the connections will, so a file that is no PEM certificate, or a key
    that is not the certificate's, is refused now with its name."""
    context = ssl.create_default_context()
    ca_certs, ca_path = settings.get("ssl_ca_certs"), settings.get("ssl_ca_path")
    if ca_certs or ca_path:
        try:
            context.load_verify_locations(cafile=ca_certs or None, capath=ca_path or None)  # type: ignore[arg-type]
        except (ssl.SSLError, OSError) as exc:
            named = f"ssl_ca_certs {ca_certs!r}" if ca_certs else f"ssl_ca_path {ca_path!r}"
            raise ValueError(f"{url}: {named}: no CA certificate (PEM) could be read ({exc})") from None
    certfile = settings.get("ssl_certfile")
    if certfile:
        keyfile = settings.get("ssl_keyfile")
        try:
            context.load_cert_chain(str(certfile), str(keyfile) if keyfile else None, password=_no_password)
        except (ssl.SSLError, OSError) as exc:
            raise ValueError(f"{url}: ssl_certfile {certfile!r}" + (f" with ssl_keyfile {keyfile!r}" if keyfile else "")
                             + f": not a PEM certificate and its unencrypted private key ({exc})") from None


def _no_password() -> str:
    raise ssl.SSLError("the private key is encrypted")


@contextmanager
def connection_hint(tls: bool) -> Iterator[None]:
    """When the store's first connection fails: what most likely went wrong with TLS, added to
    redis-py's message (which names the SSL error, not what to change)."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        hint = _hint(str(exc), tls, isinstance(exc, redis.TimeoutError))
        if hint is None:
            raise
        raise type(exc)(f"{exc} ({hint})") from exc


def _hint(message: str, tls: bool, timed_out: bool) -> str | None:
    if "CERTIFICATE_VERIFY_FAILED" in message:
        if "mismatch" in message:
            return ("the server's TLS certificate does not name the address dialled: use an address it names, "
                    "or ssl_check_hostname=false")
        return ("the server's TLS certificate is not signed by a trusted CA: pin its CA with ssl_ca_certs=PATH "
                "(or ssl_ca_path=DIR)")
    if tls and timed_out:
        return "no answer to the TLS handshake: is this a plain (non-TLS) port? then use redis://"
    if tls and ("EOF occurred in violation of protocol" in message or "CERTIFICATE_REQUIRED" in message
                or "Connection reset by peer" in message or "Connection closed by server" in message):
        return ("the server ended the TLS connection: does it require a client certificate "
                "(ssl_certfile=PATH, ssl_keyfile=PATH) signed by a CA it trusts? its log says why")
    if not tls and ("Connection reset by peer" in message or "Connection closed by server" in message):
        return "the server closed the connection at once: is this a TLS port? then use rediss://"
    return None
