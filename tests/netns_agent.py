"""A hostile agent for tests/test_intercept.py: standard library only, run as an
unprivileged user inside the agent's network namespace. It ignores every proxy variable
(http.client never reads them) and connects straight to the upstream's address: CALLS
OpenAI chat completions to HOST:80, then a bare TCP connection to HOST:OTHER_PORT.
Prints one JSON line: the status and usage of each call, and what the other port did.

    python3 netns_agent.py HOST OTHER_PORT CALLS
"""

import http.client
import json
import socket
import sys


def main(host, other_port, calls):
    results = []
    for n in range(calls):
        body = json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"call {n}"}]})
        connection = http.client.HTTPConnection(host, 80, timeout=30)
        try:
            connection.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
            answer = connection.getresponse()
            raw = answer.read()
            try:
                usage = json.loads(raw).get("usage")
            except (ValueError, AttributeError):
                usage = None
            results.append({"status": answer.status, "usage": usage, "body": raw[:200].decode(errors="replace"),
                            "governor": answer.getheader("ADL-Governor-Action")})
        except OSError as exc:
            results.append({"error": f"{type(exc).__name__}: {exc}"})
        finally:
            connection.close()
    try:
        with socket.create_connection((host, other_port), timeout=10) as sock:
            other = "connected: " + sock.recv(16).decode(errors="replace").strip()
    except OSError as exc:
        other = f"{type(exc).__name__}: {exc}"
    print(json.dumps({"calls": results, "other_port": other}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
