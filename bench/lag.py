#!/usr/bin/env python3
"""Detection lag, revocation lag and the cost of waiting, for both shapes of loading server.

Shapes (simulator units, restarted with `systemctl restart --no-block`):
  bind-late   the port is bound only once loaded: connections are refused until then (SGLang, vLLM)
  bind-early  the port is bound at once; generations answer 503 while loading (llama.cpp)
Each restart draws its load time at random from --load-min..--load-max seconds (2-7 s), so no
retry schedule lines up with the loads by luck.

In the same run, for each restart:
  truth         the new process can generate: POST /generate to it directly every 5 ms
  genready      a long-poll GET /ready/sim?wait=60&since=<restart> (what `genready wait` does)
  naive /health GET /health every 100 ms, all the time
  revocation    restart issued -> first non-200 from /ready/sim (polled every 2 ms)
  detection     the new process can generate -> the checker's first "ready"
  cost          genready's CPU (utime+stime from /proc) and its probes per second between the
                new process appearing and it being able to generate

Run as root: .venv/bin/python bench/lag.py [--restarts 10] [--shapes bind-late,bind-early]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from genready_dev.harness import Genready, answers_ok, booted_manager, free_port, http, pct, show, sim_unit, wait_for
from genready_dev.usermanager import UserManager

SHAPES = {"bind-late": (), "bind-early": ("--bind-early",)}
NAIVE_INTERVAL = 0.1
TRUTH_INTERVAL = 0.005


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rpartition(b")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Poller(threading.Thread):
    """GET url every `interval` seconds for the whole run; keeps (sent, received, ok)."""

    def __init__(self, url: str, interval: float) -> None:
        super().__init__(daemon=True)
        self.url, self.interval = url, interval
        self.answers: list[tuple[float, float, bool]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            sent = time.monotonic()
            v = answers_ok(self.url, timeout=1.0)
            self.answers.append((sent, time.monotonic(), v))
            self.halt.wait(max(0.0, self.interval - (time.monotonic() - sent)))

    def first_ready(self, sent_after: float, received_after: float) -> float | None:
        return next((r for s, r, v in list(self.answers) if v and s >= sent_after and r >= received_after), None)


@dataclass
class Shape:
    name: str
    loads: list[float] = field(default_factory=list)
    revocation: list[float] = field(default_factory=list)
    genready: list[float] = field(default_factory=list)
    naive: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)  # fraction of one core while loading
    probe_rate: list[float] = field(default_factory=list)  # probes per second while loading


def one_restart(um: UserManager, g: Genready, unit: str, port: int, env_file: Path, load: float,
                naive: Poller, out: Shape) -> None:
    assert g.proc is not None
    gpid = g.proc.pid
    old = wait_for(lambda: (c := g.get("/ready/sim"))[0] == 200 and c[1]["pid"], 60, "ready before the restart")
    env_file.write_text(f"LOAD={load:.3f}\n")
    since = time.time()
    ready_at: list[float] = []

    def long_poll() -> None:
        code, _ = http(f"{g.base}/ready/sim?wait=60&since={since:.6f}", timeout=70)
        if code == 200:
            ready_at.append(time.monotonic())

    waiter = threading.Thread(target=long_poll, daemon=True)
    waiter.start()
    t_restart = time.monotonic()
    um.systemctl("restart", "--no-block", unit)
    t_revoked = wait_for(lambda: http(f"{g.base}/ready/sim", timeout=2)[0] != 200 and time.monotonic(), 30,
                         "/ready revoked", interval=0.002)
    new = wait_for(lambda: (p := show(um, unit)[0]) not in (0, old) and p, 30, "the new pid", interval=0.01)
    t_new, cpu_new = time.monotonic(), cpu_seconds(gpid)
    wait_for(lambda: answers_ok(f"http://127.0.0.1:{port}/generate", post=True, timeout=1), 60,
             "the new process generating", interval=TRUTH_INTERVAL)
    t_gen, cpu_gen = time.monotonic(), cpu_seconds(gpid)
    waiter.join(70)
    assert ready_at, f"genready never said ready for pid {new}"
    probes = g.status()["targets"]["sim"]["probes"]
    t_naive = wait_for(lambda: naive.first_ready(t_new, t_gen), 10, "the naive poller ready")
    out.loads.append(load)
    out.revocation.append(t_revoked - t_restart)
    out.genready.append(ready_at[0] - t_gen)
    out.naive.append(t_naive - t_gen)
    out.cpu.append((cpu_gen - cpu_new) / (t_gen - t_new))
    out.probe_rate.append(probes / (t_gen - t_new))


def run_shape(name: str, args: argparse.Namespace, rng: random.Random) -> Shape:
    out = Shape(name)
    tmp = Path(tempfile.mkdtemp(prefix="genready-bench-"))
    with booted_manager(tmp / "sd") as um:
        port = free_port()
        unit = "bench-lag.service"
        env_file = tmp / "load.env"
        env_file.write_text("LOAD=0.5\n")
        um.install_unit(unit, sim_unit(port, "--load-seconds", "${LOAD}", *SHAPES[name],
                                       extra=f"EnvironmentFile={env_file}"))
        um.systemctl("start", unit)
        naive = Poller(f"http://127.0.0.1:{port}/health", NAIVE_INTERVAL)
        naive.start()
        try:
            with Genready(um, tmp, {"sim": {"unit": unit, "url": f"http://127.0.0.1:{port}"}},
                          log_level="info") as g:
                for i in range(args.restarts):
                    one_restart(um, g, unit, port, env_file, rng.uniform(args.load_min, args.load_max), naive, out)
                    print(f"{name} {i + 1}/{args.restarts}: load {out.loads[-1]:.2f} s, detection genready "
                          f"{out.genready[-1] * 1000:.0f} ms, naive /health {out.naive[-1] * 1000:.0f} ms, "
                          f"cpu {out.cpu[-1] * 100:.2f} %, {out.probe_rate[-1]:.2f} probes/s", file=sys.stderr)
        finally:
            naive.halt.set()
            naive.join(5)
            um.systemctl("stop", unit)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--restarts", type=int, default=10, help="restarts per shape (default: %(default)s)")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated, of: " + ", ".join(SHAPES))
    ap.add_argument("--load-min", type=float, default=2.0)
    ap.add_argument("--load-max", type=float, default=7.0)
    ap.add_argument("--seed", type=int, default=None, help="for the load times (default: random)")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    shapes = [run_shape(name, args, rng) for name in args.shapes.split(",")]

    def ms(xs: list[float]) -> str:
        return f"{pct(xs, 50) * 1000:.0f} / {pct(xs, 99) * 1000:.0f}"

    print(f"\n{args.restarts} restarts per shape (`systemctl restart --no-block`), load times uniform in "
          f"{args.load_min:g}-{args.load_max:g} s, genready with default settings, checkers in the same run\n")
    print("| shape | detection genready p50 / p99 ms | detection naive /health (100 ms) p50 / p99 ms | "
          "revocation p50 / p99 ms | genready CPU while loading (mean / max) | probes/s while loading |")
    print("|---|---|---|---|---|---|")
    for s in shapes:
        print(f"| {s.name} | {ms(s.genready)} | {ms(s.naive)} | {ms(s.revocation)} | "
              f"{statistics.mean(s.cpu) * 100:.2f} % / {max(s.cpu) * 100:.2f} % | "
              f"{statistics.mean(s.probe_rate):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
