"""Helpers for hostile-host tests and benchmarks (issue 10): broken servers, small private
mounts genready can fill or make read-only, and reading genready's three surfaces.

Shared by tests/test_hostile.py and bench/hostile.py, so the benchmark measures exactly
what the tests check.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from genready import config
from genready.config import TargetConfig
from genready.rule import records
from genready_dev.harness import Genready


def target_config(url: str, api_: str = "sglang", **kw: Any) -> TargetConfig:
    """A full TargetConfig with every default, from the config's own table (new keys included), but
    no health step: a hostile server's answer is for the generation."""
    table = {"unit": "t.service", "url": url, "api": api_, "model": "m", "verify_owner": False, "health_path": "",
             **kw}
    return config.parse({"targets": {"t": table}}).targets["t"]


async def raw_server(answer_bytes: bytes | Callable[[int], bytes],
                     seen: list[bytes] | None = None) -> AsyncIterator[str]:
    """A loopback server answering every request with exactly `answer_bytes` (or `answer_bytes(n)` for the
    n-th request, from 0); each request's head goes to `seen`. Yields its URL."""
    count = 0

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal count
        with contextlib.suppress(Exception):
            head = await reader.readuntil(b"\r\n\r\n")
            n, count = count, count + 1
            if seen is not None:
                seen.append(head)
            writer.write(answer_bytes(n) if callable(answer_bytes) else answer_bytes)
            await writer.drain()
            await reader.read()  # until the probe closes
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


async def canned(body: bytes) -> AsyncIterator[str]:
    """A loopback server answering every request 200 with the JSON `body`; yields its URL."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    async for url in raw_server(head + body):
        yield url


def closed_by_peer(s: socket.socket) -> bool:
    try:
        return s.recv(1024) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True  # reset


_MOUNT = 'mount -t tmpfs -o size=256k tmpfs "$1" && mount -t tmpfs -o size=256k tmpfs "$2" && shift 2 && exec "$@"'


def in_own_mounts(g: Genready) -> None:
    g.state_dir.mkdir(parents=True, exist_ok=True)
    g.runtime_dir.mkdir(parents=True, exist_ok=True)
    g.wrapper = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", _MOUNT, "sh",
                 str(g.state_dir), str(g.runtime_dir)]


def ns_run(g: Genready, *argv: str) -> None:
    assert g.proc is not None
    subprocess.run(["nsenter", "-t", str(g.proc.pid), "-m", "--", *argv], check=True, capture_output=True, timeout=10)


def inside(g: Genready, path: Path) -> Path:
    """`path` as genready's mount namespace sees it."""
    assert g.proc is not None
    return Path(f"/proc/{g.proc.pid}/root") / path.relative_to("/")


def metric(g: Genready, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    code, text = g.get("/metrics")
    assert code == 200
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    raise AssertionError(f"no {name} {labels}")


def three_surfaces(g: Genready, target: str) -> tuple[bool, bool, bool]:
    """(/ready says 200, /status says ready, genready_ready is 1): never allowed to disagree."""
    return (g.get(f"/ready/{target}")[0] == 200, g.status()["targets"][target]["state"] == "ready",
            metric(g, "genready_ready", target=target) == 1)


def fill(state: Path) -> None:
    """Fill the state dir's tmpfs to the last byte, including the free end of records.jsonl's last
    page (blank lines, which a load skips): the next record write fails with ENOSPC."""
    with contextlib.suppress(OSError), (state / "filler").open("wb", buffering=0) as f:
        while True:
            f.write(b"\0" * 4096)
    for name, byte in (("filler", b"\0"), (records.RECORDS_FILE, b"\n")):
        with contextlib.suppress(OSError), (state / name).open("ab", buffering=0) as f:
            while True:
                f.write(byte)


# A server that answers garbage for its first requests, then like SGLang (HTTP/1.1 keep-alive:
# the owner proof checks the connection while it is open).
FLAKY_SERVER = r"""
import asyncio, json, sys
BAD = [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\n",
       b"HTTP/1.1 200 OK\r\nContent-Length: \xb2\r\n\r\n",
       b"HTTP/1.1 200 OK\r\nContent-Length: " + b"9" * 4300 + b"\r\n\r\n",
       b"HTTP/1.1 \xb2\xb2\xb2 OK\r\n\r\n"]
seen = 0
async def serve(reader, writer):
    global seen
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            n = int([l.split(b":")[1] for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")][0])
            await reader.readexactly(n)
            seen += 1
            if seen <= len(BAD):
                writer.write(BAD[seen - 1]); await writer.drain(); writer.close(); return
            body = json.dumps({"text": " OK", "output_ids": [11], "meta_info": {"completion_tokens": 1}}).encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\n\r\n" + body)
            await writer.drain()
    except Exception:
        writer.close()
async def main():
    server = await asyncio.start_server(serve, "127.0.0.1", int(sys.argv[1]))
    await server.serve_forever()
asyncio.run(main())
"""
