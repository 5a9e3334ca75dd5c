#!/usr/bin/env python3
"""The bench client and the sweep's plan against hostile input: the cases
that need no systemd manager, one line per case with its figure (bench/hostile.py has those that do).

Each case runs the real CLI as a child process against a loopback server that misbehaves, and
reports the child's peak RSS (wait4's ru_maxrss) and wall time next to what it said.

    .venv/bin/python bench/hostile_tools.py
"""

from __future__ import annotations

import json
import os
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from genready.apis import MAX_BODY
from genready_dev.harness import GENREADY, PY

BENCH = [PY, "-m", "genready.benchclient"]
HUGE = 300_000_000  # bytes: a 300 MB answer
CHUNK = b"x" * (1 << 20)


def line(case: str, title: str, figure: str, before: str) -> None:
    print(f"{case} | {title} | {figure} | before the fix: {before}", flush=True)


class Server(socketserver.ThreadingTCPServer):
    """A loopback HTTP server whose answer to the n-th request (from 0) is the bytes `answer(n, path)` yields."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, answer: Callable[[int, str], Iterator[bytes]]) -> None:
        self.answer, self.requests, self.lock = answer, 0, threading.Lock()
        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server: Server = self.server  # type: ignore[assignment]
        sock: socket.socket = self.request
        head = b""
        while b"\r\n\r\n" not in head:
            data = sock.recv(65536)
            if not data:
                return
            head += data
        path = head.split(b" ", 2)[1].decode()
        with server.lock:
            n, server.requests = server.requests, server.requests + 1
        try:
            for chunk in server.answer(n, path):
                sock.sendall(chunk)
        except OSError:
            return  # the client stopped reading: what a cap does


def close_delimited(size: int) -> Iterator[bytes]:
    """A 200 with no Content-Length: the body is all that comes until the connection closes."""
    yield b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"
    sent = 0
    while sent < size:
        yield CHUNK
        sent += len(CHUNK)


def sized(status: str, body: bytes, *headers: str) -> Iterator[bytes]:
    head = "".join(f"{h}\r\n" for h in headers)
    yield f"HTTP/1.1 {status}\r\n{head}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body


def run(cmd: list[str], timeout: float = 300) -> tuple[int, float, float, str]:
    """(exit status, peak RSS in MB, seconds, stdout + stderr) of a child."""
    t0 = time.monotonic()
    with tempfile.TemporaryFile() as out:
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                p.kill()
            time.sleep(0.01)
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read().decode(errors="replace")
    return p.returncode, usage.ru_maxrss / 1024, time.monotonic() - t0, text


def kinds(text: str) -> str:
    return next((ln.strip() for ln in text.splitlines() if ln.strip().startswith("requests")), "?")


def main() -> int:
    tmp = Path(tempfile.mkdtemp(prefix="genready-hostile-tools-"))
    good = json.dumps({"text": " OK", "output_ids": [11], "meta_info": {"completion_tokens": 1}}).encode()

    srv = Server(lambda n, path: close_delimited(HUGE))
    rc, rss, took, out = run([*BENCH, "--url", srv.url, "--no-stream", "-n", "1", "--timeout", "120"])
    line("huge answer", f"--no-stream, a {HUGE / 1e6:.0f} MB answer (no Content-Length)",
         f"peak RSS {rss:.0f} MB, {took:.1f} s, exit {rc}, {kinds(out)}", "1.59 GB RSS")

    srv = Server(lambda n, path: close_delimited(HUGE) if path == "/v1/models" else sized("200 OK", good))
    rc, rss, took, out = run([*BENCH, "--url", srv.url, "--api", "openai-completions", "--no-stream", "-n", "1",
                              "--timeout", "120"])
    said = "falls back to the model 'default'" if "using 'default'" in out else "?"
    line("huge models", f"a {HUGE / 1e6:.0f} MB /v1/models", f"peak RSS {rss:.0f} MB, {took:.1f} s, {said}",
         "1.2 GB RSS")

    event = b"data: " + json.dumps({"text": " OK", "meta_info": {"completion_tokens": 1}}).encode() + b"\n\n"
    huge = b"data: " + json.dumps({"text": "x" * (600 << 10), "meta_info": {"completion_tokens": 1}}).encode() + \
        b"\n\n"
    srv = Server(lambda n, path: sized("200 OK", (huge if n == 7 else event) + b"data: [DONE]\n\n",
                                       "Content-Type: text/event-stream"))
    report = tmp / "report.jsonl"
    rc, rss, took, out = run([*BENCH, "--url", srv.url, "-n", "20", "-c", "2", "--output", str(report)])
    lines = report.read_text().splitlines() if report.exists() else []
    res = json.loads(lines[0]) if lines else {}
    line("huge event", "one 600 KiB stream event among 20 requests",
         f"{res.get('ok')} ok, {res.get('failed')} failed ({', '.join(res.get('errors', {}))}); "
         f"{len(lines)} --output line, exit {rc}", "LineTooLong traceback, no summary, no --output line")

    elsewhere = Server(lambda n, path: sized("200 OK", good))
    srv = Server(lambda n, path: sized("307 Temporary Redirect", b"", f"Location: {elsewhere.url}{path}"))
    rc, rss, took, out = run([*BENCH, "--url", srv.url, "--no-stream", "-n", "10"])
    line("redirect", "every answer a 307 to another server",
         f"{kinds(out)}; the other server got {elsewhere.requests} requests", "followed, counted ok")

    plan = tmp / "plan.toml"
    plan.write_text('command = "true"\n[matrix]\n' + "".join(f"a{i} = [0, 1]\n" for i in range(20)))
    cfg = tmp / "g.toml"
    cfg.write_text('[targets.t]\nunit = "x.service"\nurl = "http://127.0.0.1:1"\n')
    rc, rss, took, out = run([*GENREADY, "sweep", str(plan), "--results", str(tmp / "r"), "--config", str(cfg),
                              "--dry-run"])
    said = next((ln for ln in out.splitlines() if "points" in ln), out.strip()[:120])
    line("huge plan", "sweep --dry-run, a plan of 20 axes x 2 values",
         f"exit {rc} in {took:.2f} s, peak RSS {rss:.0f} MB: {said.removeprefix('genready: ')}", "710 MB, 31 s")
    print(f"(bodies are read up to apis.MAX_BODY = {MAX_BODY:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
