"""Live progress and the status table: the pieces in-process, then `genready wait` and `genready
status` against a real daemon, under a pseudo-terminal (pty) and with stderr a pipe."""

from __future__ import annotations

import io
import os
import pty
import re
import select
import subprocess
import time
from pathlib import Path
from typing import Any

from genready import timewords
from genready.client import client, progress
from genready_dev.harness import GENREADY, Genready, free_port, sim_unit, wait_for
from genready_dev.usermanager import UserManager

LOADING = {"target": "sglang", "state": "loading", "pid": 4242, "loading_seconds": 190.0,
           "expected_load_seconds": 362.0, "eta_seconds": 172.0, "probes": 17, "last_error": "refused: connect"}


def test_the_live_line() -> None:
    line = progress.target_line(LOADING)
    assert line == "sglang  loading   pid 4242  3m10s of ~6m02s  [=======>      ]  ETA 2m52s  probe 17: refused"
    assert progress.target_line({**LOADING, "expected_load_seconds": None, "eta_seconds": None}) == \
        "sglang  loading   pid 4242  3m10s  probe 17: refused"
    assert "overdue" in progress.target_line({**LOADING, "loading_seconds": 400.0, "eta_seconds": 0.0})
    assert progress.bar(1.5) == "[==============]" and progress.bar(0) == "[>             ]"


def test_times_as_people_read_them() -> None:
    now = time.time()
    assert timewords.duration(4.25) == "4.2s" and timewords.duration(3725) == "1h02m"
    assert timewords.duration(362) == "6m02s"  # STATUS=, the CLI and the sweep's lines alike
    assert timewords.ago(now - 190, now) == "3m ago" and timewords.ago(now - 5, now) == "5s ago"
    iso = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(now - 190))
    assert re.fullmatch(r"\d\d:\d\d:\d\d \(3m ago\)", timewords.local_time(iso, now))


def test_live_lines_redraw_on_a_terminal_and_print_plainly_elsewhere() -> None:
    tty = io.StringIO()
    lines = progress.LiveLines(tty, tty=True)
    lines.show([LOADING, {**LOADING, "target": "vllm"}])
    lines.show([LOADING, {**LOADING, "target": "vllm"}])
    assert tty.getvalue().count("\033[2F") == 1  # the second drawing went back up two lines
    plain = io.StringIO()
    lines = progress.LiveLines(plain, tty=False, every=3600)
    lines.show([LOADING])
    lines.show([LOADING])  # no change, not 30 s later: nothing
    lines.show([{**LOADING, "state": "warming"}])
    text = plain.getvalue()
    assert "\033" not in text and len(text.splitlines()) == 2 and "warming" in text.splitlines()[1]


def test_status_table_for_people() -> None:
    now = time.time()

    def iso(ago: float) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(now - ago))

    data: dict[str, Any] = {"version": "x", "uptime_seconds": 4000, "bus": "system", "bus_connected": True,
                            "targets": {
        "sglang": {"state": "ready", "ready": True, "pid": 4242, "ready_since": iso(180), "load_seconds": 362.4,
                   "expected_load_seconds": 350.0},
        "vllm": {**LOADING, "target": "vllm", "ready": False, "waiting_since": iso(190)},
        "llama": {"state": "inactive", "ready": False, "pid": 0, "waiting_since": iso(60),
                  "reason": "llama.service is failed",
                  "last_failure": {"invocation_id": "ab" * 16, "main_pid": 77, "ended_at": iso(60),
                                   "result": "exit-code", "exit_code": "exited", "exit_status": 1,
                                   "journal": ["CUDA out of memory while loading shard 3"]}},
    }}
    text = client.format_status_tty(data, now)
    rows = {line.split()[0]: line for line in text.splitlines() if line[:1].islower()}
    assert "6m02s (~5m50s)" in rows["sglang"] and "(3m ago)" in rows["sglang"]
    assert "3m10s of ~6m02s" in rows["vllm"] and "probe 17: refused" in rows["vllm"]
    assert "exit-code exited 1, 1m ago" in rows["llama"]
    assert "  | CUDA out of memory while loading shard 3" in text
    assert "T" not in rows["sglang"].split()[3]  # no ISO 8601 in a person's table
    assert "CUDA out of memory" in client.format_status(data)  # the old format shows the failure too


# --- the commands, against a real daemon ----------------------------------------------------------

def run_in_pty(argv: list[str], env: dict[str, str], timeout: float = 60.0) -> tuple[int, str]:
    """Run `argv` with stdout and stderr on a pseudo-terminal; (exit status, everything it drew)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    out = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            r, _, _ = select.select([master], [], [], 0.5)
            if r:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the last holder of the terminal's other side is gone
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
    finally:
        os.close(master)
    return proc.wait(timeout=10), out.decode(errors="replace")


def test_wait_and_status_on_a_terminal_and_off_it(manager: UserManager, tmp_path: Path) -> None:
    port, unit = free_port(), "pr-sim.service"
    manager.install_unit(unit, sim_unit(port, "--load-seconds", "4"))
    g = Genready(manager, tmp_path, {"sim": {"unit": unit, "url": f"http://127.0.0.1:{port}",
                                             "backoff_initial": 0.05, "backoff_max": 0.2, "verify_owner": False}})
    env = {**os.environ, **manager.env, "TERM": "xterm"}
    try:
        with g:
            manager.systemctl("start", unit)
            wait_for(lambda: g.ready_pid("sim"), 30, "the first load")  # history: the usual load is known
            manager.systemctl("restart", "--no-block", unit)
            wait_for(lambda: g.ready_pid("sim") is None, 10, "the restart under way")
            rc, screen = run_in_pty([*GENREADY, "wait", "sim", "--url", g.base, "--timeout", "60"], env)
            assert rc == 0, screen
            assert "\033[" in screen and re.search(r"sim\s+(loading|starting)", screen), screen
            assert re.search(r"of ~\d+\.\ds  \[[=> ]+\]  ETA", screen), screen
            assert "sim: ready pid" in screen
            # not a terminal: plain lines, no control sequences, a line at each change of state
            manager.systemctl("restart", "--no-block", unit)
            wait_for(lambda: g.ready_pid("sim") is None, 10, "the restart under way")
            done = subprocess.run([*GENREADY, "wait", "sim", "--url", g.base, "--timeout", "60"], env=env,
                                  capture_output=True, text=True, timeout=90)
            assert done.returncode == 0 and "\033" not in done.stderr, done.stderr
            assert re.search(r"^\d\d:\d\d:\d\d sim\s+(loading|starting)", done.stderr, re.M), done.stderr
            # genready status: a table for people on a terminal, the old text elsewhere
            rc, screen = run_in_pty([*GENREADY, "status", "--url", g.base], env)
            assert rc == 0 and "LOAD (EXPECTED)" in screen and "ago)" in screen, screen
            plain = subprocess.run([*GENREADY, "status", "--url", g.base], env=env, capture_output=True,
                                   text=True, timeout=30)
            assert "READY SINCE" in plain.stdout and "LOAD (EXPECTED)" not in plain.stdout
    finally:
        manager.remove_unit(unit)
