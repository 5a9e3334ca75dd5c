#!/usr/bin/env python3
"""Start-up cost of the CLI: `genready wait TARGET --timeout 0` against a running, ready daemon.

That command is the ExecCondition= of genready-bench@.service and the first line of most scripts,
so its wall time is mostly Python start-up and imports. Goal: <= 100 ms p50 on these machines.
A private user manager runs the simulator and `genready serve`; the CLI is then run N times
(exit 0 each time) and its wall time reported as p50 / p90 / max, next to a bare `python -c pass`.
Each checkout is byte-compiled first, as an installed package is (dh_python3, pip): with
PYTHONDONTWRITEBYTECODE set, as on the project's machines, every run would compile from source.

`--pythonpath DIR` times another checkout's CLI (its `daemon/` directory) against the same daemon,
for a before/after in one run:

    git worktree add /tmp/old <commit> && .venv/bin/python bench/cli_start.py --pythonpath /tmp/old/daemon

Run as root: .venv/bin/python bench/cli_start.py [--runs 20]
"""

from __future__ import annotations

import argparse
import compileall
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from genready_dev.harness import Genready, booted_manager, free_port, sim_unit, wait_for


def timed(cmds: list[tuple[list[str], dict[str, str]]], runs: int) -> list[list[float]]:
    """Wall seconds of each command, `runs` times, sorted. The commands take turns, so a before and
    an after meet the same load on a shared machine."""
    out: list[list[float]] = [[] for _ in cmds]
    for _ in range(runs):
        for (cmd, env), times in zip(cmds, out, strict=True):
            t0 = time.perf_counter()
            r = subprocess.run(cmd, env=env, capture_output=True, text=True)
            times.append(time.perf_counter() - t0)
            if r.returncode != 0:
                raise SystemExit(f"{' '.join(cmd)} exited {r.returncode}: {r.stderr}")
    return [sorted(t) for t in out]


def row(name: str, t: list[float]) -> str:
    p90 = t[min(len(t) - 1, int(0.9 * len(t)))]
    return f"| {name} | {statistics.median(t) * 1000:.0f} | {p90 * 1000:.0f} | {t[-1] * 1000:.0f} |"


def byte_compile(daemon_dir: Path) -> None:
    for pkg in ("genready", "genready_dev"):
        if (daemon_dir / pkg).is_dir():
            compileall.compile_dir(daemon_dir / pkg, quiet=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--pythonpath", action="append", default=[], metavar="DIR",
                    help="also time the CLI found in DIR (another checkout's daemon/ directory)")
    args = ap.parse_args()
    import genready

    byte_compile(Path(genready.__file__).resolve().parent.parent)
    for path in args.pythonpath:
        byte_compile(Path(path))
    with tempfile.TemporaryDirectory(prefix="genready-cli-bench-") as d:
        tmp = Path(d)
        with booted_manager(tmp / "sd") as um:
            port = free_port()
            um.install_unit("sim.service", sim_unit(port))
            um.systemctl("start", "sim.service")
            with Genready(um, tmp, {"t": {"unit": "sim.service", "url": f"http://127.0.0.1:{port}"}}) as g:
                wait_for(lambda: g.ready_pid("t"), 30, "the target ready")
                env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
                # The console script, as a unit's ExecCondition= runs it (not `python -m`, whose runpy
                # costs ~3 ms of its own); another checkout is found first through PYTHONPATH.
                script = Path(sysconfig.get_path("scripts")) / "genready"
                entry = [str(script)] if script.exists() else [sys.executable, "-m", "genready.cli"]
                cli = [*entry, "wait", "t", "--timeout", "0", "--config", str(g.config_path)]
                names = ["python3 -c pass (floor)", "genready wait t --timeout 0 (this checkout)"]
                cmds = [([sys.executable, "-c", "pass"], env), (cli, env)]
                for path in args.pythonpath:
                    names.append(f"genready wait t --timeout 0 ({path})")
                    cmds.append((cli, {**env, "PYTHONPATH": path}))
                rows = [row(name, t) for name, t in zip(names, timed(cmds, args.runs), strict=True)]
    print(f"{args.runs} runs each, wall ms")
    print("| command | p50 | p90 | max |\n|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
