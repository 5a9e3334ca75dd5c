#!/usr/bin/env python3
"""genready on a hostile host: each case against a private systemd user manager,
one line per case with its figure. Loopback only; bounded in time (~2 min) and count.

Run as root: .venv/bin/python bench/hostile.py [--only 1,4,6]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import genready_dev.hostile as th
from genready import config
from genready.probe.probe import Prober
from genready_dev.harness import GENREADY, Genready, alive, free_port, show, sim_unit, wait_for
from genready_dev.usermanager import UserManager

CHECK_CONFIG_TIMEOUT = 30


def line(case: int, title: str, figure: str, before: str = "") -> None:
    print(f"case {case} | {title} | {figure}" + (f" | before the fix: {before}" if before else ""),
          flush=True)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_mb(pid: int) -> float:
    for row in Path(f"/proc/{pid}/status").read_text().splitlines():
        if row.startswith("VmRSS:"):
            return int(row.split()[1]) / 1024
    return float("nan")


def timed_get(g: Genready, path: str, timeout: float = 5.0) -> tuple[int, float]:
    t0 = time.monotonic()
    code, _ = g.get(path, timeout)
    return code, time.monotonic() - t0


def sigterm_seconds(g: Genready) -> float:
    assert g.proc is not None
    t0, w0 = time.monotonic(), time.time()
    g.proc.send_signal(signal.SIGTERM)
    try:
        g.proc.wait(30)
    except subprocess.TimeoutExpired:
        g.proc.send_signal(signal.SIGUSR1)  # faulthandler: every thread's stack into the log
        time.sleep(1)
        print(g.log_path.read_text()[-6000:])
        raise
    took = time.monotonic() - t0
    if os.environ.get("BENCH_DEBUG"):
        from datetime import datetime
        for row in g.log_path.read_text().splitlines():
            if "shutting down" in row or "stopped" in row or "shutdown took" in row:
                ts = datetime.strptime(row[:23], "%Y-%m-%d %H:%M:%S.%f").timestamp()
                print(f"  +{(ts - w0) * 1000:.0f} ms {row[24:100]}")
        print(f"  exit +{took * 1000:.0f} ms")
    return took


def check_config(tmp: Path, text: str | bytes) -> subprocess.CompletedProcess[str]:
    path = tmp / f"check-{time.monotonic_ns()}.toml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return subprocess.run([*GENREADY, "check-config", "--config", str(path)], capture_output=True, text=True,
                          timeout=CHECK_CONFIG_TIMEOUT, check=False)


GOOD = '[targets.t]\nunit = "t.service"\nurl = "http://127.0.0.1:30000"\n'
SLEEPER = "[Service]\nExecStart=/bin/sleep infinity\n"
FAST = {"backoff_initial": 0.05, "backoff_max": 0.3, "probe_timeout": 2.0}


def sim(um: UserManager, unit: str) -> dict[str, Any]:
    port = free_port()
    um.install_unit(unit, sim_unit(port, "--load-seconds", "0.3"))
    um.systemctl("restart", unit)
    return {"unit": unit, "url": f"http://127.0.0.1:{port}", **FAST}


def restart_verified(g: Genready, um: UserManager, unit: str, target: str = "s", timeout: float = 30) -> float:
    """Seconds from `systemctl restart` until /ready names the new MainPID."""
    old = show(um, unit)[0]
    t0 = time.monotonic()
    um.systemctl("restart", "--no-block", unit)

    def new_ready() -> bool:
        pid = show(um, unit)[0]
        return pid not in (0, old) and g.get(f"/ready/{target}?pid={pid}")[0] == 200

    wait_for(new_ready, timeout, "the new start verified", interval=0.01)
    return time.monotonic() - t0


# -- case 1: malformed answers -------------------------------------------------------------------

def case1(um: UserManager, tmp: Path) -> None:
    script = tmp / "flaky.py"
    script.write_text(th.FLAKY_SERVER)
    port = free_port()
    unit = "bh-flaky.service"
    um.install_unit(unit, f"[Service]\nExecStart={sys.executable} {script} {port}\n")
    um.systemctl("restart", unit)
    # The flaky server answers only POSTs: no health step.
    with Genready(um, tmp, {"f": {"unit": unit, "url": f"http://127.0.0.1:{port}", "health_path": "", **FAST}}) as g:
        t0 = time.monotonic()
        wait_for(lambda: g.get("/ready/f")[0] == 200, 30, "verified", interval=0.01)
        took = time.monotonic() - t0
        probes = g.status()["targets"]["f"]["probes"]
        bad = th.metric(g, "genready_probes_total", target="f", result="bad_response")
        tracebacks = g.log().count("Traceback")
    um.systemctl("stop", unit)
    line(1, "4 malformed answers (chunk -1, CL '²', CL 4,300 digits, status '²²²'), then good ones",
         f"verified {ms(took)} after genready's API was up; probes {probes} ({bad:.0f} bad_response); "
         f"tracebacks {tracebacks}", "probe task died silently: loading, probes=0 until the next D-Bus event")


# -- cases 2 and 3: full state_dir, read-only runtime_dir ----------------------------------------

def case2(um: UserManager, tmp: Path) -> None:
    unit = "bh-full.service"
    g = Genready(um, tmp, {"s": sim(um, unit)})
    th.in_own_mounts(g)
    with g:
        wait_for(lambda: g.get("/ready/s")[0] == 200, 30, "verified")
        th.fill(th.inside(g, g.state_dir))
        took = restart_verified(g, um, unit)
        agree = th.three_surfaces(g, "s")
        errors = th.metric(g, "genready_record_errors_total")
        logged = g.log().count("cannot write start records")
        inv = show(um, unit)[1]
        t0 = time.monotonic()
        (th.inside(g, g.state_dir) / "filler").unlink()
        records = th.inside(g, g.state_dir) / "records.jsonl"
        wait_for(lambda: inv in records.read_text(), 30, "caught up", interval=0.05)
        caught = time.monotonic() - t0
    um.systemctl("stop", unit)
    line(2, "restart with state_dir full (tmpfs), then space freed",
         f"new start verified {ms(took)} after the restart; /ready,/status,metric agree: {all(agree)}; "
         f"record errors counted {errors:.0f}, logged {logged}x; on disk {ms(caught)} after space was freed",
         "503 'a job is pending' forever, also after freeing space and SIGHUP")


def case3(um: UserManager, tmp: Path) -> None:
    unit = "bh-ro.service"
    g = Genready(um, tmp, {"s": sim(um, unit)})
    th.in_own_mounts(g)
    with g:
        stamp_file = th.inside(g, g.runtime_dir / "s.ready")
        wait_for(lambda: g.get("/ready/s")[0] == 200 and stamp_file.exists(), 30, "verified")
        th.ns_run(g, "mount", "-o", "remount,ro", str(g.runtime_dir))
        took = restart_verified(g, um, unit)
        agree = th.three_surfaces(g, "s")
        errors = th.metric(g, "genready_stamp_errors_total", target="s")
        pid = show(um, unit)[0]
        t0 = time.monotonic()
        th.ns_run(g, "mount", "-o", "remount,rw", str(g.runtime_dir))
        wait_for(lambda: json.loads(stamp_file.read_text())["pid"] == pid, 30, "stamp caught up", interval=0.05)
        caught = time.monotonic() - t0
    um.systemctl("stop", unit)
    line(3, "restart with runtime_dir read-only, then writable again",
         f"new start verified {ms(took)} after the restart; /ready,/status,metric agree: {all(agree)}; "
         f"stamp errors counted {errors:.0f}; stamp names the new PID {ms(caught)} after remount rw",
         "/ready 200 while /status said loading and genready_ready 0; stale stamp, no log")


# -- case 4: file descriptors --------------------------------------------------------------------

def case4(um: UserManager, tmp: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # this client opens thousands
    unit = "bh-fd.service"
    g = Genready(um, tmp, {"s": sim(um, unit)}, log_level="info")
    g.wrapper = ["prlimit", "--nofile=1024:1024", "--"]  # a common default soft limit
    answers: dict[str, int] = {}
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            code, body = g.get("/ready/s", timeout=2)
            kind = {200: "ready", 0: "no answer"}.get(code, f"{code}")
            if code == 503:
                kind = "503 over cap" if "maximum" in str(body) else "503 not ready"
            answers[kind] = answers.get(kind, 0) + 1
            stop.wait(0.05)

    socks: list[socket.socket] = []
    slow: list[socket.socket] = []
    with g:
        assert g.proc is not None
        wait_for(lambda: g.get("/ready/s")[0] == 200, 30, "verified")
        fd0 = fds(g.proc.pid)
        log0 = g.log_path.stat().st_size
        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        t0 = time.monotonic()
        for i in range(3100):  # 2,000 long-polls (pid=1 never is ready) and 1,100 slowloris connections
            try:
                s = socket.create_connection(("127.0.0.1", g.port), timeout=2)
                s.sendall(b"GET /ready/s?wait=600&pid=1 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" if i % 3 else
                          b"GET /ready HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                s.setblocking(False)
                (socks if i % 3 else slow).append(s)
            except OSError:
                pass
        fd_peak = fds(g.proc.pid)
        opened = time.monotonic() - t0
        t0 = time.monotonic()
        took = restart_verified(g, um, unit, timeout=60)
        wait_for(lambda: all(th.closed_by_peer(s) for s in slow), 30, "slowloris closed", interval=0.2)
        slow_closed = time.monotonic() - t0
        for s in socks + slow:
            s.close()
        wait_for(lambda: fds(g.proc.pid) < fd0 + 10 if g.proc else True, 30, "flood gone", interval=0.1)
        stop.set()
        poller.join(5)
        fd1 = fds(g.proc.pid)
        refused = {why: th.metric(g, "genready_api_refused_total", why=why)
                   for why in ("evicted", "connections", "long_polls", "read_timeout")}
        log_bytes = g.log_path.stat().st_size - log0
        emfile = th.metric(g, "genready_probes_total", target="s", result="local_resources")
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    um.systemctl("stop", unit)
    line(4, "3,100 connections (2/3 long-polls, 1/3 slowloris) under LimitNOFILE=1024",
         f"fds {fd0} -> peak {fd_peak} -> {fd1}; /ready polled meanwhile: {answers}; restart verified in "
         f"{ms(took)}; flood opened in {opened:.1f} s, its {len(slow)} slowloris all closed {slow_closed:.1f} s "
         f"later; refused {refused}; EMFILE probes {emfile:.0f}; log {log_bytes} bytes",
         "/ready unanswered, EMFILE as refused, restart verified after 35.6 s, 66 MB of tracebacks")


# -- case 5: unit names --------------------------------------------------------------------------

def case5(um: UserManager, tmp: Path) -> None:
    results = []
    for unit in ("foo@.service", "x" * 300 + ".service"):
        r = check_config(tmp, GOOD.replace('"t.service"', json.dumps(unit)))
        results.append(f"{unit[:14]}{'…' if len(unit) > 14 else ''}: exit {r.returncode}")
    line(5, "check-config with an invalid unit name", "; ".join(results),
         "accepted, then every target unknown in a reconnect loop at serve")


# -- case 6: many targets ------------------------------------------------------------------------

def case6(um: UserManager, tmp: Path) -> None:
    n = 200
    for i in range(n):
        um.install_unit(f"bh-many{i}.service", SLEEPER)
    um.systemctl("daemon-reload")
    for start in range(0, n, 50):
        um.systemctl("start", *[f"bh-many{i}.service" for i in range(start, min(n, start + 50))])
    targets = {f"t{i}": {"unit": f"bh-many{i}.service", "url": f"http://127.0.0.1:{free_port()}",
                         "backoff_initial": 1.0, "backoff_max": 2.0} for i in range(n)}
    g = Genready(um, tmp, targets, log_level="info")
    answered: list[float] = []

    def first_answer() -> None:  # the API binds before the watcher reads the 200 units
        while not answered and time.monotonic() - t0 < 30:
            with contextlib.suppress(Exception):
                if g.get("/status", timeout=1.0)[0] == 200:
                    answered.append(time.monotonic() - t0)
            time.sleep(0.01)

    t0 = time.monotonic()
    poller = threading.Thread(target=first_answer, daemon=True)
    poller.start()
    with g:
        following = time.monotonic() - t0  # start() returns once /status says bus_connected: all 200 read
        poller.join(30)
        first = answered[0] if answered else float("nan")
        wait_for(lambda: all(t["state"] != "unknown" for t in g.status()["targets"].values()), 30, "all watched")
        ready_lat = [timed_get(g, "/ready")[1] for _ in range(30)]
        status_lat = [timed_get(g, "/status")[1] for _ in range(30)]
        assert g.proc is not None
        rss = rss_mb(g.proc.pid)
        term = sigterm_seconds(g)
    line(6, f"{n} targets", f"first API answer {ms(first)} after start, all {n} units read {ms(following)}; "
         f"/ready p50 {ms(statistics.median(ready_lat))} "
         f"max {ms(max(ready_lat))}; /status p50 {ms(statistics.median(status_lat))} max {ms(max(status_lat))}; "
         f"RSS {rss:.0f} MB; SIGTERM -> exit {ms(term)}")
    over = "".join(f'[targets.t{i}]\nunit = "t{i}.service"\nurl = "http://127.0.0.1:{30000 + i}"\n'
                   for i in range(config.MAX_TARGETS + 1))
    r = check_config(tmp, over)
    line(6, f"{config.MAX_TARGETS + 1} targets", f"check-config exit {r.returncode}: {r.stderr.splitlines()[0][-60:]}")
    for i in range(0, n, 50):
        um.systemctl("stop", *[f"bh-many{j}.service" for j in range(i, min(n, i + 50))])
    case6_sigterm(um, tmp)




# -- case 7: secrets and exposure ----------------------------------------------------------------

def case7(um: UserManager, tmp: Path) -> None:
    r = check_config(tmp, GOOD.replace("http://127.0.0.1:30000", "http://admin:pw@127.0.0.1:30000/"))
    w = check_config(tmp, '[daemon]\nlisten = "0.0.0.0:9901"\n\n' + GOOD)
    victim = tmp / "victim"
    victim.write_text("precious\n")
    state = tmp / "state"
    state.mkdir()
    (state / "records.jsonl").symlink_to(victim)
    cfg = tmp / "link.toml"
    cfg.write_text(f'[daemon]\nlisten = "127.0.0.1:{free_port()}"\nbus = "user"\nstate_dir = "{state}"\n'
                   f'runtime_dir = "{tmp / "run"}"\n\n' + GOOD)
    s = subprocess.run([*GENREADY, "serve", "--config", str(cfg)], capture_output=True, text=True, timeout=30,
                       check=False, env=um.env)
    untouched = victim.read_text() == "precious\n"
    line(7, "userinfo URL; listen 0.0.0.0; records.jsonl a symlink",
         f"userinfo: exit {r.returncode}, password shown: {'pw@' in r.stderr}; 0.0.0.0 warned by check-config: "
         f"{'not a loopback' in w.stderr}; symlink: serve exit {s.returncode}, target untouched: "
         f"{untouched}",
         "userinfo accepted and shown in /status; no warning; symlink followed")


# -- case 8: small ones --------------------------------------------------------------------------

def case8(um: UserManager, tmp: Path) -> None:
    with Genready(um, tmp, {"t": {"unit": "bh-none.service", "url": "http://127.0.0.1:1"}}, log_level="info") as g:
        codes = [g.get("/ready?pid=" + q)[0] for q in ("%C2%B2", "%E2%91%A0", "%D9%A3", "1" * 5000)]
        log0 = g.log_path.stat().st_size
        n = 100
        for _ in range(n):
            with socket.create_connection(("127.0.0.1", g.port), timeout=5) as s:
                s.sendall(b"GET /ready HTTP/1.1\r\nBad Header\r\n\r\n")
                s.recv(4096)
        per_request = (g.log_path.stat().st_size - log0) / n
    bom = check_config(tmp, b"\xef\xbb\xbf" + GOOD.encode())

    async def zero_tokens() -> str:
        async for url in th.canned(json.dumps({"text": "OK", "meta_info": {"completion_tokens": 0}}).encode()):
            prober = Prober(th.target_config(url))
            try:
                return str((await prober.probe(0)).failure)
            finally:
                await prober.close()
        return "?"

    failure = asyncio.run(zero_tokens())
    table = "| 71 |" in (Path(__file__).resolve().parents[1] / "README.md").read_text()
    line(8, "pid=²/①/٣/5,000 digits; 100 malformed requests; BOM; text with 0 tokens; exit 71",
         f"/ready answers {codes}; log {per_request:.0f} bytes per malformed request; BOM: exit {bom.returncode} "
         f"{'(named)' if 'BOM' in bom.stderr else ''}; 0-token text: {failure}; 71 in README: {table}",
         "500 with traceback; 544 bytes/request; 'invalid statement'; ready; 71 undocumented")


def case6_sigterm(um: UserManager, tmp: Path) -> None:
    """SIGTERM in states that used to delay it: a probe waiting on a server that never answers,
    long-polls in flight, keep-alive connections open, just after start."""
    port = free_port()
    unit = "bh-hang.service"
    um.install_unit(unit, sim_unit(port, "--hang-after", "0"))
    um.systemctl("restart", unit)
    results: list[str] = []
    for state in ("just started", "a probe hanging (probe_timeout 30 s)", "50 long-polls in flight",
                  "50 idle keep-alive connections"):
        d = tmp / str(len(results))
        d.mkdir()
        g = Genready(um, d, {"h": {"unit": unit, "url": f"http://127.0.0.1:{port}", "probe_timeout": 30.0}})
        socks: list[socket.socket] = []
        with g:
            if state != "just started":
                wait_for(lambda g=g: g.status()["targets"]["h"]["state"] == "loading", 30, "probing")  # type: ignore[misc]
                time.sleep(0.3)  # not synchronisation: lets the first probe get stuck in the hung server
            for _ in range(50 if "50" in state else 0):
                s = socket.create_connection(("127.0.0.1", g.port), timeout=5)
                s.sendall(b"GET /ready/h?wait=600 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" if "long-polls" in state
                          else b"GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                socks.append(s)
            time.sleep(0.2)  # not synchronisation: the requests reach their handlers
            results.append(f"{state}: {ms(sigterm_seconds(g))}")
        for s in socks:
            s.close()
    um.systemctl("stop", unit)
    line(6, "SIGTERM -> exit", "; ".join(results), "1.8-2.0 s even idle")


# -- the daemon, the CLI and guard, with a manager ---------------------------------------------

def cli_run(*args: str, timeout: float) -> tuple[int | str, float]:
    """(exit status, or "still running" at `timeout`; seconds). Output to /dev/null: a pipe would be
    held open by whatever CMD leaves running, and waiting for its end is not waiting for genready."""
    t0 = time.monotonic()
    try:
        p = subprocess.run([*GENREADY, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout,
                           check=False)
    except subprocess.TimeoutExpired:
        return f"still running after {timeout:g} s", time.monotonic() - t0
    return p.returncode, time.monotonic() - t0


def case9(um: UserManager, tmp: Path) -> None:
    """SIGHUP (config unchanged) every 5 ms while /ready is polled and guard runs."""
    unit = "bh-hup.service"
    g = Genready(um, tmp, {"s": sim(um, unit)}, log_level="info")
    with g:
        assert g.proc is not None
        wait_for(lambda: g.get("/ready/s")[0] == 200, 30, "verified")
        stop = threading.Event()
        pid = g.proc.pid

        def storm() -> None:
            while not stop.wait(0.005):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGHUP)

        hup = threading.Thread(target=storm, daemon=True)
        hup.start()
        codes: dict[int, int] = {}
        eintr = 0
        for _ in range(450):
            code, body = g.get("/ready/s")
            codes[code] = codes.get(code, 0) + 1
            eintr += "nterrupted" in str(body)
        guards = [cli_run("guard", "s", "--url", g.base, "--", "sleep", "1", timeout=60)[0] for _ in range(3)]
        stop.set()
        hup.join(5)
        up = g.proc.poll() is None
    um.systemctl("stop", unit)
    line(9, "SIGHUP every 5 ms (config unchanged): 450 /ready polls, 3 guard runs",
         f"/ready answers {codes} ({eintr} 'Interrupted system call'); guard exits {guards}; genready up: {up}",
         "15-24 of ~450 polls 503 'systemd read failed: Interrupted system call'; guard 75 in 1 of 3")


def case10(um: UserManager, tmp: Path) -> None:
    """The config path a FIFO or /dev/zero, on reload and at start, under a 3 GiB address-space limit."""
    unit = "bh-cfg.service"
    limit = ["prlimit", f"--as={3 << 30}", "--"]
    g = Genready(um, tmp, {"s": sim(um, unit)}, log_level="info")
    g.wrapper = limit
    results = []
    with g:
        assert g.proc is not None
        wait_for(lambda: g.get("/ready/s")[0] == 200, 30, "verified")
        good = g.config_path.read_bytes()
        for kind in ("FIFO", "/dev/zero"):
            g.config_path.unlink()
            if kind == "FIFO":
                os.mkfifo(g.config_path)
            else:
                g.config_path.symlink_to("/dev/zero")
            t0 = time.monotonic()
            g.proc.send_signal(signal.SIGHUP)
            worst, refused = 0.0, None
            while time.monotonic() - t0 < 5 and g.proc.poll() is None:
                t1 = time.monotonic()
                code, body = g.get("/status", timeout=1)
                worst = max(worst, time.monotonic() - t1)
                if code == 200 and body.get("config_error"):
                    refused = time.monotonic() - t0
                    break
            if kind == "FIFO" and refused is None:  # unfreeze a daemon that waits for a writer
                with contextlib.suppress(OSError):
                    os.close(os.open(g.config_path, os.O_WRONLY))  # it has the FIFO open for reading
            ended = g.proc.poll()
            state = f"exited {ended}" if ended is not None else f"up, RSS {rss_mb(g.proc.pid):.0f} MB"
            verdict = f"refused after {ms(refused)}" if refused is not None else "not refused in 5 s"
            results.append(f"{kind}: {verdict}, slowest /status {ms(worst)}, genready {state}")
            g.config_path.unlink()
            g.config_path.write_bytes(good)
            if g.proc.poll() is not None:
                break
            g.proc.send_signal(signal.SIGHUP)  # the good config back: no refusal left to be taken for the next one

            def reloaded() -> bool:
                code, body = g.get("/status", timeout=1)
                return code == 200 and not body.get("config_error")

            try:
                wait_for(reloaded, 30, "the good config reloaded", interval=0.2)
            except AssertionError:
                results.append("genready did not take the good config back within 30 s")
                break
    um.systemctl("stop", unit)
    fifo = tmp / "start.fifo"
    os.mkfifo(fifo)
    starts = []
    for path in (fifo, Path("/dev/zero")):
        rc, took = cli_run("check-config", "--config", str(path), timeout=10) if path == fifo else \
            _limited_check(limit, path)[:2]
        starts.append(f"check-config {path.name}: exit {rc} in {ms(took)}")
    line(10, "config path a FIFO or /dev/zero, SIGHUP'd and at start (address space 3 GiB)",
         "; ".join(results + starts),
         "FIFO: API frozen until something was written; /dev/zero: memory grew until the kernel killed genready")


def _limited_check(limit: list[str], path: Path) -> tuple[int | str, float, str]:
    t0 = time.monotonic()
    p = subprocess.run([*limit, *GENREADY, "check-config", "--config", str(path)], capture_output=True, text=True,
                       timeout=60, check=False)
    return p.returncode, time.monotonic() - t0, p.stderr[-100:]


def case11(um: UserManager, tmp: Path) -> None:
    """Guard and wait as a careless user runs them."""
    unit = "bh-guard.service"
    g = Genready(um, tmp, {"s": sim(um, unit)}, log_level="info")
    out = []
    rc: int | str  # an exit status, or what happened instead
    with g:
        wait_for(lambda: g.get("/ready/s")[0] == 200, 30, "verified")
        for sig in (signal.SIGHUP, signal.SIGQUIT):
            pidfile = tmp / f"child-{sig}"
            run = subprocess.Popen([*GENREADY, "guard", "s", "--url", g.base, "--", "sh", "-c",
                                    f"sleep 300 & echo $! > {pidfile}.t; mv {pidfile}.t {pidfile}; wait"],
                                   stderr=subprocess.DEVNULL)
            wait_for(pidfile.exists, 20, "guarded command started")
            child = int(pidfile.read_text())
            run.send_signal(sig)
            rc = run.wait(30)
            time.sleep(0.5)  # not synchronisation: lets a killed child be reaped before it is looked at
            out.append(f"{sig.name}: guard exit {rc}, CMD's child {'still running' if alive(child) else 'ended'}")
            if alive(child):
                os.kill(child, signal.SIGKILL)
        started = tmp / "ignores"
        run = subprocess.Popen([*GENREADY, "guard", "s", "--url", g.base, "--", "sh", "-c",
                                f"trap '' TERM; echo $$ > {started}.t; mv {started}.t {started}; "
                                "while :; do sleep 0.1; done"], stderr=subprocess.DEVNULL)
        wait_for(started.exists, 20, "guarded command started")
        t0 = time.monotonic()
        run.send_signal(signal.SIGTERM)
        try:
            rc = run.wait(15)
            out.append(f"CMD ignoring SIGTERM: guard exit {rc} after {time.monotonic() - t0:.1f} s")
        except subprocess.TimeoutExpired:
            out.append("CMD ignoring SIGTERM: guard still waiting after 15 s")
            run.kill()
            run.wait(10)
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(started.read_text()), signal.SIGKILL)  # the CMD this bench started, if it outlived guard
        pidfile = tmp / "daemon.pid"
        rc, _ = cli_run("guard", "s", "--url", g.base, "--", "sh", "-c", f"sleep 300 & echo $! > {pidfile}",
                           timeout=60)
        child = int(pidfile.read_text())
        time.sleep(0.5)  # not synchronisation: as above
        out.append(f"forked daemon: guard exit {rc}, daemon {'still running' if alive(child) else 'ended'}")
        if alive(child):
            os.kill(child, signal.SIGKILL)
        rc, _ = cli_run("guard", "s", "--url", g.base, "--", "sh", "-c", "kill -9 $$", timeout=60)
        out.append(f"CMD SIGKILLed: guard exit {rc}")
        rc, took = cli_run("wait", "s", "--url", g.base, "--timeout", "nan", "--since", str(time.time()), timeout=5)
        out.append(f"wait --timeout nan (a start newer than now): {rc} in {ms(took)}")
        before = th.metric(g, "genready_ready_requests_total", code="200")
        rc, took = cli_run("guard", "s", "--url", g.base, "--interval", "0", "--", "sleep", "2", timeout=10)
        rate = (th.metric(g, "genready_ready_requests_total", code="200") - before) / took
        out.append(f"guard --interval 0 -- sleep 2: {rc}, {rate:.0f} /ready requests/s")
        told = subprocess.run(["sh", "-c", 'exec 3>&2; "$@" 2>&-; echo $? >&3', "sh", *GENREADY, "guard", "nope",
                               "--url", g.base, "--", "true"], capture_output=True, text=True, timeout=30).stderr
        out.append(f"guard (not ready) with stderr closed: {told.strip()}")
        r, w = os.pipe()
        os.close(r)
        p = subprocess.run([*GENREADY, "wait", "s", "--url", g.base, "--timeout", "5"], stdout=w,
                           stderr=subprocess.DEVNULL, timeout=30, check=False)
        os.close(w)
        out.append(f"wait (ready) into a closed pipe: {p.returncode}")
        g.stop()
        waiter = subprocess.Popen([*GENREADY, "wait", "s", "--url", g.base, "--timeout", "60"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1)  # not synchronisation: the daemon stays down for a second
        early = waiter.poll()
        t0 = time.monotonic()
        g.start()
        rc = waiter.wait(60) if early is None else early
        out.append(f"wait across a daemon restart: exit {rc}" + (f", {time.monotonic() - t0:.1f} s after it was back"
                                                               if early is None else " at once"))
    um.systemctl("stop", unit)
    line(11, "guard and wait as a careless user runs them", "; ".join(out),
         "SIGHUP/SIGQUIT: 129/131, CMD kept running; SIGTERM-ignoring CMD: guard waits for ever; forked daemon "
         "outlived guard's 0; SIGKILLed CMD: 247; --timeout nan: never ends; --interval 0: ~130 requests/s; "
         "closed stderr: 1; closed stdout: traceback 1; wait across a restart: 69 at once")


def case12(um: UserManager, tmp: Path) -> None:
    """Reloads and the unit's configuration."""
    unit, unit_b = "bh-rl.service", "bh-rl-b.service"
    a = sim(um, unit)
    b = {"unit": unit_b, "url": f"http://127.0.0.1:{free_port()}", **FAST}  # never started: never ready
    g = Genready(um, tmp, {"s": a, "b": b}, log_level="info")
    out = []
    with g:
        assert g.proc is not None
        wait_for(lambda: g.get("/ready/s")[0] == 200, 30, "verified")
        cfg = g.config_path.read_text()
        result: list[tuple[int, float]] = []

        def long_poll() -> None:
            t0 = time.monotonic()
            result.append((g.get("/ready/b?wait=30", timeout=40)[0], t0))

        poll = threading.Thread(target=long_poll)
        poll.start()
        time.sleep(0.5)  # not synchronisation: the long-poll reaches its handler
        g.config_path.write_text(cfg.replace("[targets.b]", "[old.b]").split("[old.b]")[0])
        t1 = time.monotonic()
        g.proc.send_signal(signal.SIGHUP)
        poll.join(40)
        code, _ = result[0]
        out.append(f"long-poll on a removed target: {code} {ms(time.monotonic() - t1)} after the SIGHUP")
        port = free_port()
        g.config_path.write_text(g.config_path.read_text().replace(f"127.0.0.1:{g.port}", f"127.0.0.1:{port}"))
        g.proc.send_signal(signal.SIGHUP)
        time.sleep(0.5)  # not synchronisation: the reload is applied (an old genready says nothing to wait for)
        st = g.status()
        checked = subprocess.run([*GENREADY, "check-config", "--config", str(g.config_path)], capture_output=True,
                                 text=True, timeout=30)
        out.append(f"listen changed: still answers on the old port: {g.get('/status')[0] == 200}; /status "
                   f"restart_needed: {bool(st.get('restart_needed'))}; check-config says restart needed: "
                   f"{'restart needed' in checked.stderr}")
        g.config_path.write_text(cfg.replace("[targets.b]", "[old.b]").split("[old.b]")[0])
        g.proc.send_signal(signal.SIGHUP)
        req = f"GET /status HTTP/1.1\r\nHost: rebind.evil.example:{g.port}\r\nConnection: close\r\n\r\n".encode()
        with socket.create_connection(("127.0.0.1", g.port), timeout=5) as sock:
            sock.sendall(req)
            answer = sock.recv(200).split(b"\r\n")[0].decode()
        out.append(f"Host: rebind.evil.example: {answer}")
        um.install_unit(unit, sim_unit(int(a["url"].rsplit(":", 1)[1]), "--load-seconds", "0.3",
                                       extra="Environment=BENCH_EDIT=1"))
        t0 = time.monotonic()
        try:
            wait_for(lambda: g.get("/ready/s")[1].get("config_changed_since_start"), 10, "the edit noticed")
            noticed = f"flagged {ms(time.monotonic() - t0)} after daemon-reload"
        except AssertionError:
            noticed = "not flagged in 10 s"
        code, body = g.get("/ready/s")
        rc, _ = cli_run("guard", "s", "--url", g.base, "--", "true", timeout=30)
        out.append(f"unit edited + daemon-reload, not restarted: /ready {code}, {noticed}: "
                   f"{body.get('config_changes')}; guard exit {rc}")
    um.systemctl("stop", unit)
    line(12, "reloads: target removed under a long-poll, listen changed, Host: of another name, unit edited",
         "; ".join(out), "long-poll waited its full time, then 503; listen change: nothing said; any Host answered; "
         "an edited, not restarted unit: ready, nothing said, guard ran")


CASES: dict[int, Callable[[UserManager, Path], None]] = {
    1: case1, 2: case2, 3: case3, 4: case4, 5: case5, 6: case6, 7: case7, 8: case8, 9: case9, 10: case10,
    11: case11, 12: case12}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="comma-separated case numbers (default: all)")
    args = ap.parse_args()
    only = {int(c) for c in args.only.split(",") if c} or set(CASES)
    tmp = Path(tempfile.mkdtemp(prefix="genready-hostile-"))
    with UserManager(tmp / "sd") as um:
        for case in sorted(only):
            d = tmp / f"case{case}"
            d.mkdir()
            CASES[case](um, d)
    return 0


if __name__ == "__main__":
    sys.exit(main())
