"""`governor exec`: run an agent command whose every outbound connection goes through the
governor, without changing the command (for clients that ignore HTTPS_PROXY: Node's fetch,
the npm `openai` client).

How (Linux, unprivileged where user namespaces are allowed; no iptables):
1. A child process enters a new user and network namespace (`unshare`). Its network has only
   loopback, and a *local* route for every address (`ip route add local 0.0.0.0/0 dev lo`),
   so a connection to any address, api.openai.com's or 127.0.0.1's, lands on a socket of the
   namespace, and the accepted socket's own address is where the agent meant to go.
2. In there it binds the relayed ports (80, 443 by default, `--port` adds more) and port 53
   (UDP), hands those sockets to the parent over a Unix socket pair (SCM_RIGHTS: sockets
   keep the namespace they were made in), drops its privileges in a nested user namespace
   (the agent cannot change the routes) and executes the command.
3. The parent, outside, accepts on those sockets and relays each connection to the
   governor's explicit proxy with `CONNECT host:port` (the host is the name the agent looked
   up, from the DNS answers below, else the address), so the governor sees it exactly as it
   sees an HTTPS_PROXY client and governs it; the agent trusts the governor's CA through
   SSL_CERT_FILE, REQUESTS_CA_BUNDLE and NODE_EXTRA_CA_CERTS.
4. DNS queries (UDP 53, to whatever resolver the agent's resolv.conf names: every address is
   local) are answered by the parent: an A query with an address of 198.18.0.0/15 (RFC 2544's
   benchmarking block) kept for that name, AAAA and the rest with no answer, so the relay
   knows the name a connection was for. A name resolved another way (/etc/hosts, a resolver
   reached over a Unix socket) reaches the governor as its address.

Fail closed: nothing leaves the namespace but through the governor; a port not relayed, TCP
to port 53 and every other protocol have no socket to reach and are refused. An `ADL-Session`
header the agent sends reaches the governor, which strips it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

# Proxy variables the agent might honour: removed, since inside the namespace the governor's
# loopback address is the namespace's own (nothing listens there); every connection is
# relayed anyway.
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy",
                   "no_proxy")
# Where clients look for extra or replacement CAs: all point at the governor's CA (inside the
# namespace every TLS connection is the governor's).
CA_VARIABLES = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "CURL_CA_BUNDLE")
FAKE_NETWORK = ipaddress.IPv4Network("198.18.0.0/15")
CONNECT_HEAD_LIMIT = 16 * 1024  # the governor's answer to CONNECT, at most
CONNECT_TIMEOUT = 30.0
SETUP_TIMEOUT = 30.0
RELAY_CHUNK = 64 * 1024


class ExecError(Exception):
    """The namespace could not be set up (no user namespaces here, no `ip`): a clear message."""


@dataclass(frozen=True)
class ExecPlan:
    command: Sequence[str]
    proxy: tuple[str, int]  # the governor's explicit proxy, outside the namespace
    ca_file: Path | None
    ports: tuple[int, ...] = (80, 443)
    environment: Mapping[str, str] = field(default_factory=dict)  # the agent's, before ours

    def agent_environment(self) -> dict[str, str]:
        env = {k: v for k, v in self.environment.items() if k not in PROXY_VARIABLES}
        if self.ca_file is not None:
            env.update({name: str(self.ca_file) for name in CA_VARIABLES})
        return env


def ip_command() -> str:
    for candidate in (shutil.which("ip"), "/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise ExecError("`ip` (iproute2) is needed to set up the agent's network namespace; install iproute2")


# --- the child: the namespace, its sockets, the command -----------------------------------------


def _write(path: str, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


def _enter_namespaces(uid: int, gid: int) -> None:
    os.unshare(os.CLONE_NEWUSER | os.CLONE_NEWNET)
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"0 {uid} 1")
    _write("/proc/self/gid_map", f"0 {gid} 1")


def _route_everything_locally(ip: str) -> None:
    for argv in ([ip, "link", "set", "lo", "up"], [ip, "route", "add", "local", "0.0.0.0/0", "dev", "lo"]):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=SETUP_TIMEOUT)
        if done.returncode != 0:
            raise ExecError(f"{' '.join(argv[1:])}: {done.stderr.strip() or done.returncode}")
    # IPv6 where the kernel has it: every address local too (else IPv6 simply has no route)
    subprocess.run([ip, "-6", "route", "add", "local", "::/0", "dev", "lo"], capture_output=True, timeout=SETUP_TIMEOUT)


def _bind_sockets(ports: Sequence[int]) -> list[socket.socket]:
    sockets = []
    for port in ports:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("0.0.0.0", port))
        listener.listen(128)
        sockets.append(listener)
    dns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    dns.bind(("0.0.0.0", 53))
    sockets.append(dns)
    return sockets


def _drop_to_user(uid: int, gid: int) -> None:
    """A nested user namespace mapping the agent back to its own ids: it keeps no capability
    over the network namespace (it cannot change the routes)."""
    os.unshare(os.CLONE_NEWUSER)
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} 0 1")
    _write("/proc/self/gid_map", f"{gid} 0 1")


def _child(plan: ExecPlan, channel: socket.socket, ip: str) -> None:
    """In the forked child: never returns."""
    try:
        uid, gid = os.getuid(), os.getgid()
        _enter_namespaces(uid, gid)
        _route_everything_locally(ip)
        sockets = _bind_sockets(plan.ports)
        socket.send_fds(channel, [b"ready"], [s.fileno() for s in sockets])
        for s in sockets:
            s.close()
        channel.close()
        _drop_to_user(uid, gid)
    except (OSError, ExecError, subprocess.SubprocessError) as exc:
        try:
            channel.sendall(f"error: {exc}".encode())
        finally:
            os._exit(126)
    try:
        os.execvpe(plan.command[0], list(plan.command), plan.agent_environment())
    except OSError as exc:
        print(f"governor exec: {plan.command[0]}: {exc.strerror or exc}", file=sys.stderr, flush=True)
        os._exit(127)


# --- the parent: DNS answers and the relay --------------------------------------------------------


class FakeNames:
    """Names the agent looked up, each given an address of FAKE_NETWORK (and back)."""

    def __init__(self) -> None:
        self.by_name: dict[str, ipaddress.IPv4Address] = {}
        self.by_address: dict[ipaddress.IPv4Address, str] = {}

    def address(self, name: str) -> ipaddress.IPv4Address | None:
        name = name.lower().rstrip(".")
        if name not in self.by_name:
            if len(self.by_name) >= FAKE_NETWORK.num_addresses - 2:
                return None
            address = FAKE_NETWORK.network_address + 1 + len(self.by_name)
            self.by_name[name], self.by_address[address] = address, name
        return self.by_name[name]

    def name(self, address: str) -> str | None:
        try:
            return self.by_address.get(ipaddress.IPv4Address(address))
        except ValueError:
            return None


def dns_answer(query: bytes, names: FakeNames) -> bytes | None:
    """The answer to one DNS query datagram (RFC 1035), or None for what is not a query."""
    if len(query) < 12:
        return None
    ident, flags, qdcount = struct.unpack("!HHH", query[:6])
    if flags & 0x8000 or qdcount != 1:  # an answer, or not one question: not ours to answer
        return None
    labels, offset = [], 12
    while True:
        if offset >= len(query):
            return None
        length = query[offset]
        if length == 0:
            offset += 1
            break
        if length & 0xC0 or offset + 1 + length > len(query):  # no compression in a question
            return None
        labels.append(query[offset + 1:offset + 1 + length].decode("ascii", "replace"))
        offset += 1 + length
    if offset + 4 > len(query):
        return None
    qtype, qclass = struct.unpack("!HH", query[offset:offset + 4])
    question = query[12:offset + 4]
    rd = flags & 0x0100
    answers = b""
    rcode = 0
    if qtype == 1 and qclass == 1 and labels:  # A IN
        address = names.address(".".join(labels))
        if address is None:
            rcode = 2  # SERVFAIL: no address left
        else:
            answers = b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 60, 4) + address.packed
    header = struct.pack("!HHHHHH", ident, 0x8000 | 0x0400 | rd | 0x0080 | rcode, 1, 1 if answers else 0, 0, 0)
    return header + question + answers


class DNSResponder(asyncio.DatagramProtocol):
    def __init__(self, names: FakeNames) -> None:
        self.names = names
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple) -> None:
        answer = dns_answer(data, self.names)
        if answer is not None and self.transport is not None:
            self.transport.sendto(answer, addr)


class Relay:
    """Each connection accepted in the namespace, relayed to the governor with CONNECT."""

    def __init__(self, proxy: tuple[str, int], names: FakeNames) -> None:
        self.proxy = proxy
        self.names = names
        self.tasks: set[asyncio.Task] = set()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self.tasks.add(task)
        upstream_writer = None
        try:
            address, port = writer.get_extra_info("sockname")[:2]
            host = self.names.name(address) or address
            target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            upstream_reader, upstream_writer = await asyncio.wait_for(
                asyncio.open_connection(*self.proxy), CONNECT_TIMEOUT)
            upstream_writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
            head = await asyncio.wait_for(upstream_reader.readuntil(b"\r\n\r\n"), CONNECT_TIMEOUT)
            status = head.split(b"\r\n", 1)[0].split(b" ")
            if len(status) < 2 or status[1] != b"200":
                print(f"governor exec: the governor refused CONNECT {target}: {head.split(b'\r\n', 1)[0].decode(errors='replace')}",
                      file=sys.stderr, flush=True)
                return
            await asyncio.gather(self._pipe(reader, upstream_writer), self._pipe(upstream_reader, writer))
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            print(f"governor exec: relay to the governor at {self.proxy[0]}:{self.proxy[1]} failed: {exc!r}",
                  file=sys.stderr, flush=True)
        finally:
            for w in (writer, upstream_writer):
                if w is not None:
                    w.close()
            if task is not None:
                self.tasks.discard(task)

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while chunk := await reader.read(RELAY_CHUNK):
                writer.write(chunk)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
        except OSError:
            writer.close()


async def _serve(sockets: list[socket.socket], plan: ExecPlan, pid: int) -> int:
    loop = asyncio.get_running_loop()
    names = FakeNames()
    relay = Relay(plan.proxy, names)
    servers = []
    transports = []
    for sock in sockets:
        if sock.type == socket.SOCK_DGRAM:
            transport, _ = await loop.create_datagram_endpoint(lambda: DNSResponder(names), sock=sock)
            transports.append(transport)
        else:
            servers.append(await asyncio.start_server(relay.handle, sock=sock, limit=CONNECT_HEAD_LIMIT))
    exited = loop.create_future()
    pidfd = os.pidfd_open(pid)

    def reap() -> None:
        if not exited.done():
            _, status = os.waitpid(pid, 0)
            exited.set_result(os.waitstatus_to_exitcode(status))

    loop.add_reader(pidfd, reap)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(signum, os.kill, pid, signum)
    try:
        code = await exited
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)
        for server in servers:
            server.close()
        for transport in transports:
            transport.close()
        for task in list(relay.tasks):
            task.cancel()
        await asyncio.gather(*relay.tasks, return_exceptions=True)
    return code


def run(plan: ExecPlan) -> int:
    """Run the command governed; its exit code (negative: the signal that ended it)."""
    if not sys.platform.startswith("linux"):
        raise ExecError("governor exec needs Linux network namespaces; elsewhere use HTTPS_PROXY or --mode reverse")
    ip = ip_command()
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        parent.close()
        _child(plan, child, ip)
    child.close()
    try:
        parent.settimeout(SETUP_TIMEOUT)
        message, fds, _, _ = socket.recv_fds(parent, 4096, len(plan.ports) + 1)
    except OSError as exc:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise ExecError(f"the agent's namespace did not start: {exc}") from None
    finally:
        parent.close()
    if message != b"ready" or len(fds) != len(plan.ports) + 1:
        for fd in fds:
            os.close(fd)
        os.waitpid(pid, 0)
        reason = message.decode(errors="replace").removeprefix("error: ") or "it exited"
        raise ExecError(f"could not set up the agent's network namespace: {reason} (unprivileged user namespaces "
                        "may be disabled here: sysctl kernel.unprivileged_userns_clone, or AppArmor's "
                        "kernel.apparmor_restrict_unprivileged_userns; use HTTPS_PROXY or --mode reverse instead)")
    sockets = [socket.socket(fileno=fd) for fd in fds]
    return asyncio.run(_serve(sockets, plan, pid))


__all__ = ["ExecPlan", "ExecError", "run", "dns_answer", "FakeNames", "PROXY_VARIABLES", "CA_VARIABLES"]
