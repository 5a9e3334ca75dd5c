#!/usr/bin/env python3
"""genready on a hostile host (issue 10): each case against a private systemd user manager,
one line per case with its figure. Loopback only; bounded in time (~2 min) and count.

Run as root: .venv/bin/python bench/hostile.py [--only 1,4,6]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.helpers import GENREADY, Genready, free_port, wait_for

from genready import config
from genready.usermanager import UserManager

CHECK_CONFIG_TIMEOUT = 30


def line(case: int, title: str, figure: str) -> None:
    print(f"case {case} | {title} | {figure}", flush=True)


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
    t0 = time.monotonic()
    with g:
        first = time.monotonic() - t0  # start() returns at the first /status 200
        wait_for(lambda: all(t["state"] != "unknown" for t in g.status()["targets"].values()), 30, "all watched")
        ready_lat = [timed_get(g, "/ready")[1] for _ in range(30)]
        status_lat = [timed_get(g, "/status")[1] for _ in range(30)]
        assert g.proc is not None
        rss = rss_mb(g.proc.pid)
        term = sigterm_seconds(g)
    line(6, f"{n} targets", f"first API answer {ms(first)} after start; /ready p50 {ms(statistics.median(ready_lat))} "
         f"max {ms(max(ready_lat))}; /status p50 {ms(statistics.median(status_lat))} max {ms(max(status_lat))}; "
         f"RSS {rss:.0f} MB; SIGTERM -> exit {ms(term)}")
    over = "".join(f'[targets.t{i}]\nunit = "t{i}.service"\nurl = "http://127.0.0.1:{30000 + i}"\n'
                   for i in range(config.MAX_TARGETS + 1))
    r = check_config(tmp, over)
    line(6, f"{config.MAX_TARGETS + 1} targets", f"check-config exit {r.returncode}: {r.stderr.splitlines()[0][-60:]}")
    for i in range(0, n, 50):
        um.systemctl("stop", *[f"bh-many{j}.service" for j in range(i, min(n, i + 50))])


CASES: dict[int, Callable[[UserManager, Path], None]] = {6: case6}


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
