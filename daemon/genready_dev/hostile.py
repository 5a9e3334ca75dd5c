"""Helpers for hostile-host tests and benchmarks: broken servers, small private
mounts genready can fill or make read-only, a frozen systemd manager, a failed start after a huge
output file, and reading genready's three surfaces.

Shared by tests/test_hostile.py and bench/hostile.py, so the benchmark measures exactly
what the tests check.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from genready import config
from genready.config import TargetConfig
from genready.store import records
from genready_dev.harness import GENREADY, Genready, free_port, genready_service, sim_unit, wait_for
from genready_dev.usermanager import UserManager


def target_config(url: str, api_: str = "sglang", **kw: Any) -> TargetConfig:
    """A full TargetConfig with every default, from the config's own table (new keys included), but
    no health step: a hostile server's answer is for the generation."""
    table = {"unit": "t.service", "url": url, "api": api_, "model": "m", "verify_owner": False, "health_path": "",
             **kw}
    return config.parse({"targets": {"t": table}}).targets["t"]


async def raw_server(answer_bytes: bytes | Callable[[int], bytes],
                     seen: list[bytes] | None = None, *, close: bool = False) -> AsyncIterator[str]:
    """A loopback server answering every request with exactly `answer_bytes` (or `answer_bytes(n)` for the
    n-th request, from 0); each request's head goes to `seen`. Yields its URL. The connection stays open
    until the client closes it; with `close` the server's side is shut once the answer is written (EOF)."""
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
            if close:
                writer.write_eof()  # the answer ends here; a close with the request unread would be a reset
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


@dataclass
class Frozen:
    """What genready answered while its systemd manager was SIGSTOPped, and after the SIGCONT."""

    answers: dict[str, list[tuple[float, int, Any]]]  # path -> (seconds, status, body) each
    metrics_gauge: list[str]  # genready_systemd_responsive lines seen while frozen
    thaw_to_ready: float  # seconds from SIGCONT to the first 200 on /ready/TARGET
    log: str  # genready's log since the freeze

    def slowest(self, path: str) -> float:
        return max(s for s, _, _ in self.answers[path])


def _timed_get(g: Genready, path: str) -> tuple[float, int, Any]:
    t0 = time.monotonic()
    code, body = g.get(path, timeout=30)
    return time.monotonic() - t0, code, body


def _stopped(pid: int) -> bool:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("State:"):
                return line.split()[1] in ("T", "t")
    return False


def frozen_manager(um: UserManager, tmp: Path, seconds: float = 4.0, *, during_reread: bool = False) -> Frozen:
    """A simulator unit verified ready; its manager SIGSTOPped for `seconds` while /ready, /status
    and /metrics are asked in turn; then SIGCONT and /ready polled until 200. The manager is
    continued in a finally, whatever happens. `um` must be a manager of its own: every unit and
    client of a frozen manager waits.

    `during_reread`: the manager freezes just as the watcher is to re-read every unit after a
    daemon-reload, its pystemd connection's moment of risk (see genready.systemd's docstring).
    Made certain, not left to a race: genready is stopped (SIGSTOP) first, the reload's
    Reloading(false) signal queues on its bus socket, the manager is frozen, and only then is
    genready continued: the first thing its watcher does is that re-read."""
    port = free_port()
    unit = "frozen-sim.service"
    um.install_unit(unit, sim_unit(port, extra=f"StandardError=append:{tmp}/{unit}.log"))
    um.systemctl("start", unit)
    assert um.proc is not None
    pid = um.proc.pid  # unshare → sh → systemd, exec'd in place: the manager itself
    g = Genready(um, tmp, {"t": {"unit": unit, "url": f"http://127.0.0.1:{port}", "backoff_initial": 0.05,
                                 "backoff_max": 0.3}}).start()
    try:
        wait_for(lambda: g.get("/ready/t")[0] == 200, 30, "the simulator verified ready")
        mark = len(g.log_path.read_text(errors="replace"))
        answers: dict[str, list[tuple[float, int, Any]]] = {"/ready/t": [], "/status": [], "/metrics": []}
        gauge: list[str] = []
        daemon_pid = g.proc.pid if during_reread and g.proc is not None else 0
        if daemon_pid:
            os.kill(daemon_pid, signal.SIGSTOP)
        try:
            try:
                if daemon_pid:
                    wait_for(lambda: _stopped(daemon_pid), 5, "genready stopped")
                    # Returns once the manager has answered Reload, which it sends after
                    # Reloading(false): that signal is on its way to genready's socket by then.
                    um.systemctl("daemon-reload")
                os.kill(pid, signal.SIGSTOP)
                wait_for(lambda: _stopped(pid), 5, "the manager stopped")
            finally:
                if daemon_pid:
                    os.kill(daemon_pid, signal.SIGCONT)
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                for path, got in answers.items():
                    got.append(_timed_get(g, path))
                    if path == "/metrics" and isinstance(got[-1][2], str):
                        gauge += [ln for ln in got[-1][2].splitlines() if ln.startswith("genready_systemd_responsive")]
        finally:
            os.kill(pid, signal.SIGCONT)
        thawed = time.monotonic()
        wait_for(lambda: g.get("/ready/t")[0] == 200, 60, "/ready 200 after the thaw", interval=0.01)
        thaw_to_ready = time.monotonic() - thawed
        # The recovery is logged after the first answer; wait for it, not for a guessed time.
        wait_for(lambda: "answers again" in g.log_path.read_text(errors="replace")[mark:], 30, "the thaw logged")
        return Frozen(answers, gauge, thaw_to_ready, g.log_path.read_text(errors="replace")[mark:])
    finally:
        g.stop()
        um.systemctl("stop", unit, check=False)


# --- a failed start after a huge output file ---------------------------------------------------

@contextlib.contextmanager
def memory_cgroup(limit: int) -> Iterator[Path | None]:
    """A cgroup v1 memory cgroup of `limit` bytes under this process's own, where the host has one
    (on hybrid hosts a user manager's MemoryMax= has no memory controller to use), else None."""
    line = next((x for x in Path("/proc/self/cgroup").read_text().splitlines() if x.split(":")[1] == "memory"), None)
    here = Path("/sys/fs/cgroup/memory" + line.split(":", 2)[2]) if line else None
    if here is None or not (here / "cgroup.procs").exists():
        yield None
        return
    cg = here / f"genready-test-{os.getpid()}"
    cg.mkdir()
    try:
        (cg / "memory.limit_in_bytes").write_text(str(limit))
        yield cg
    finally:
        wait_for(lambda: not (cg / "cgroup.procs").read_text().strip(), 10, "the memory cgroup empty")
        cg.rmdir()


def vm_kb(pid: int, key: str) -> int:
    """A /proc/PID/status figure in kB (VmRSS: now, VmHWM: the peak)."""
    status = Path(f"/proc/{pid}/status").read_text()
    m = re.search(rf"^{key}:\s+(\d+) kB$", status, re.M)
    assert m, status
    return int(m.group(1))


@dataclass
class HugeOutput:
    rss_before_kb: int  # genready's RSS while the start loaded
    peak_kb: int  # its peak RSS once the failed start's lines were shown
    lines: list[str]  # what /status showed as the start's last lines
    survived: bool  # the same genready process, still active
    cgroup: Path | None  # the memory cgroup genready ran in, if any


def huge_output_failure(um: UserManager, tmp: Path, size: int, limit: int = 256 << 20) -> HugeOutput:
    """A unit whose output file holds `size` bytes (sparse) before a start that fails while genready
    runs: genready is started mid-load (so it has no mark of where that start's lines begin, and
    reads the file's own tail), as a unit of `um` with MemoryMax= `limit` as shipped, and in a
    memory cgroup of `limit` where the host has one."""
    out, go = tmp / "server.out", tmp / "go"
    with out.open("wb") as fh:
        fh.truncate(size)  # sparse: nothing written, so the run is fast
    script = tmp / "server.sh"
    script.write_text("#!/bin/sh\n"
                      "for i in $(seq 1 30); do echo \"loading shard $i\"; done\n"
                      f"while [ ! -e {go} ]; do sleep 0.05; done\n"
                      "echo 'CUDA out of memory while loading shard 3' >&2\n"
                      "exit 3\n")
    script.chmod(0o755)
    unit, gunit = "huge-out.service", "huge-genready.service"
    um.install_unit(unit, f"[Service]\nExecStart={script}\nStandardOutput=append:{out}\nStandardError=append:{out}\n")
    um.systemctl("start", unit)
    g = Genready(um, tmp, {"huge": {"unit": unit, "url": f"http://127.0.0.1:{free_port()}", "gate_startup": False,
                                    "backoff_initial": 0.05, "backoff_max": 0.2, "verify_owner": False}},
                 log_level="info")
    cmd = shlex.join(GENREADY)
    try:
        with memory_cgroup(limit) as cg:
            serve = f"{cmd} serve --config {g.config_path}"
            # Into the memory cgroup first, where there is one; `$$$$` is the shell's $$ to systemd.
            start = f"/bin/sh -c 'echo $$$$ > {cg}/cgroup.procs && exec {serve}'" if cg else serve
            um.install_unit(gunit, genready_service(g.config_path, g.log_path, f"MemoryMax={limit}").replace(
                f"ExecStart={serve}", f"ExecStart={start}"))
            um.systemctl("start", gunit)
            pid = int(um.show(gunit, "MainPID")["MainPID"])
            wait_for(lambda: g.status()["targets"]["huge"]["state"] == "loading", 15, "the target loading")
            before = vm_kb(pid, "VmRSS")
            go.touch()
            lines: list[str] = []
            with contextlib.suppress(AssertionError):  # not shown: said by `lines`, `survived`
                lines = wait_for(lambda: ((x := g.status()["targets"]["huge"]["last_failure"]) and x["journal"]), 15,
                                 "the failed start's lines in /status")
            alive = um.show(gunit, "ActiveState", "MainPID")
            survived = alive["ActiveState"] == "active" and int(alive["MainPID"]) == pid
            peak = vm_kb(pid, "VmHWM") if survived else 0
            um.systemctl("stop", gunit)
        return HugeOutput(before, peak, lines, survived, cg)
    finally:
        um.systemctl("stop", gunit, unit, check=False)
        um.systemctl("reset-failed", unit, gunit, check=False)
        um.remove_unit(unit)
        um.remove_unit(gunit)
