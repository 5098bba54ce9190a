"""A hostile agent for tests/test_intercept.py: standard library only, run as an
unprivileged user inside the agent's network namespace. It ignores every proxy variable
(http.client never reads them) and connects straight to the upstream's address: CALLS
OpenAI chat completions to HOST:80, then a bare TCP connection to HOST:OTHER_PORT, then
the escapes interception must close: a chat call to an LLM listening on HOST:53 (TCP), a
UDP datagram to HOST:53, one to the pod's resolver RESOLVER:53 (which must pass), and an
ICMP echo carrying a payload (a ping socket). Prints one JSON line: the status and usage of
each call, and what each escape did.

    python3 netns_agent.py HOST OTHER_PORT CALLS RESOLVER
"""

import http.client
import json
import socket
import sys


def chat(host, port, n):
    body = json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"call {n}"}]})
    connection = http.client.HTTPConnection(host, port, timeout=30)
    try:
        connection.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        answer = connection.getresponse()
        raw = answer.read()
        try:
            usage = json.loads(raw).get("usage")
        except (ValueError, AttributeError):
            usage = None
        return {"status": answer.status, "usage": usage, "body": raw[:200].decode(errors="replace"),
                "governor": answer.getheader("ADL-Governor-Action")}
    except OSError as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        connection.close()


def udp(host, port):
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.settimeout(3)
            sock.connect((host, port))
            sock.send(b"\x12\x34exfiltrated")
            return "answered: " + sock.recv(64).decode(errors="replace")
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"


def ping(host):
    """An ICMP echo request with a payload, through an unprivileged ping socket."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP) as sock:
            sock.settimeout(3)
            payload = b"exfiltrated"
            header = bytes([8, 0, 0, 0, 0, 0, 0, 1])  # echo request; the kernel sets id and checksum
            sock.sendto(header + payload, (host, 0))
            reply = sock.recv(128)
            return "answered: " + reply[8:].decode(errors="replace")
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"


def main(host, other_port, calls, resolver):
    results = [chat(host, 80, n) for n in range(calls)]
    try:
        with socket.create_connection((host, other_port), timeout=10) as sock:
            other = "connected: " + sock.recv(16).decode(errors="replace").strip()
    except OSError as exc:
        other = f"{type(exc).__name__}: {exc}"
    escapes = {"llm_on_53": chat(host, 53, calls), "udp_53": udp(host, 53), "resolver": udp(resolver, 53),
               "icmp": ping(host)}
    print(json.dumps({"calls": results, "other_port": other, "escapes": escapes}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
