#!/usr/bin/env python3
"""A minimal MCP client over stdio, for the packaging checks: start COMMAND, initialize,
call run-code (python, print(6*7)) and check the answer is 42. Prints how long each step
took from the start of COMMAND, so the first call of a fresh install can be timed.

usage: mcp_call.py [--label NAME] -- COMMAND [ARG...]
"""
import json
import os
import subprocess
import sys
import threading
import time


def main() -> int:
    args = sys.argv[1:]
    label = "server"
    if len(args) >= 2 and args[0] == "--label":
        label, args = args[1], args[2:]
    if not args or args[0] != "--" or len(args) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    command = args[1:]
    start = time.monotonic()
    child = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    err_lines = []

    def drain_stderr() -> None:
        for line in child.stderr:
            err_lines.append(line.decode(errors="replace"))

    threading.Thread(target=drain_stderr, daemon=True).start()

    def send(msg: dict) -> None:
        child.stdin.write((json.dumps(msg) + "\n").encode())
        child.stdin.flush()

    def answer(want_id: int, deadline_s: float) -> dict:
        # The deadline is a guard against a hung server, not a measurement.
        timer = threading.Timer(deadline_s, child.kill)
        timer.start()
        try:
            for raw in child.stdout:
                msg = json.loads(raw)
                if msg.get("id") == want_id:
                    return msg
        finally:
            timer.cancel()
        raise RuntimeError(
            f"{label}: the server ended before answering request {want_id}; its stderr:\n"
            + "".join(err_lines[-40:])
        )

    try:
        send({
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "replbox-ci", "version": "0"},
            },
        })
        init = answer(1, 300)
        t_init = time.monotonic() - start
        server = init.get("result", {}).get("serverInfo", {})
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        send({
            "jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "run-code",
                       "arguments": {"languageId": "python", "code": "print(6*7)"}},
        })
        call = answer(2, 120)
        t_call = time.monotonic() - start
    finally:
        child.stdin.close()
    try:
        child.wait(timeout=20)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
    result = call.get("result", {})
    text = "".join(c.get("text", "") for c in result.get("content", []))
    if result.get("isError") or text.strip() != "42":
        print(f"{label}: run-code answered {json.dumps(call)[:2000]}", file=sys.stderr)
        return 1
    print(
        f"{label}: {server.get('name')} {server.get('version')}: initialize answered after "
        f"{t_init:.1f} s, run-code python print(6*7) -> 42 after {t_call:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
