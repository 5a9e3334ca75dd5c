#!/usr/bin/env python3
"""Readiness truth and lag: genready against three naive checks, watching the same restarts.

A simulator unit (--load-seconds 2 --linger-seconds 2) is restarted with
`systemctl restart --no-block` N times. In the same run four checkers poll:
  genready       GET /ready/sim every 10 ms
  /v1/models     GET every 100 ms (the reconfigure script in DEVELOPERS.md's story)
  /health        GET every 100 ms
  kubelet-style  POST /generate every 10 s (a generation probe, its verdict held between probes)
Truth: from the moment the restart is queued until the new process can generate (polled
directly every 5 ms), the server the unit runs *now* cannot serve the benchmark.
  false-ready answers: polls sent in that window that said ready (and restarts with any)
  held-ready s:        time in that window during which the checker's last verdict was still
                       "ready" (includes up to one poll interval before it could notice)
  revocation lag:      restart queued -> the checker's first "not ready"
  detection lag:       new process can generate -> the checker's first "ready"

Run as root: .venv/bin/python bench/truth.py [--restarts 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from genready_dev.harness import Genready, answers_ok, booted_manager, free_port, pct, show, sim_unit, wait_for


@dataclass
class Checker:
    name: str
    url: str
    interval: float
    post: bool = False
    answers: list[tuple[float, float, bool]] = field(default_factory=list)  # (sent, received, ready)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            sent = time.monotonic()
            verdict = answers_ok(self.url, self.post)
            self.answers.append((sent, time.monotonic(), verdict))
            stop.wait(max(0.0, self.interval - (time.monotonic() - sent)))

    def verdict_at(self, t: float) -> bool:
        held = False
        for _, received, v in self.answers:
            if received > t:
                break
            held = v
        return held

    def is_ready_now(self) -> bool:
        return bool(self.answers) and self.answers[-1][2]


def held_ready_seconds(c: Checker, start: float, end: float) -> float:
    total, t, v = 0.0, start, c.verdict_at(start)
    for _, received, verdict in c.answers:
        if received <= start:
            continue
        if received >= end:
            break
        if v:
            total += received - t
        t, v = received, verdict
    return total + (end - t if v else 0.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--restarts", type=int, default=30)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="genready-bench-"))
    windows: list[tuple[float, float]] = []
    with booted_manager(tmp / "sd") as um:
        port = free_port()
        unit = "bench-truth.service"
        um.install_unit(unit, sim_unit(port, "--load-seconds", "2", "--linger-seconds", "2"))
        um.systemctl("start", unit)
        sim = f"http://127.0.0.1:{port}"
        with Genready(um, tmp, {"sim": {"unit": unit, "url": sim}}, log_level="info") as g:
            checkers = [Checker("genready /ready", f"{g.base}/ready/sim", 0.01),
                        Checker("naive /v1/models", f"{sim}/v1/models", 0.1),
                        Checker("naive /health", f"{sim}/health", 0.1),
                        Checker("kubelet-style generation probe (10 s)", f"{sim}/generate", 10.0, post=True)]
            stop = threading.Event()
            threads = [threading.Thread(target=c.run, args=(stop,), daemon=True) for c in checkers]
            for t in threads:
                t.start()
            try:
                for i in range(args.restarts):
                    wait_for(lambda: all(c.is_ready_now() for c in checkers), 30, "every checker ready")
                    old = show(um, unit)[0]
                    um.systemctl("restart", "--no-block", unit)
                    t_queued = time.monotonic()
                    wait_for(lambda old=old: show(um, unit)[0] not in (0, old), 30, "new pid")  # type: ignore[misc]
                    wait_for(lambda: answers_ok(f"{sim}/generate", post=True, timeout=1), 30, "new process generating",
                             interval=0.005)
                    windows.append((t_queued, time.monotonic()))
                    print(f"restart {i + 1}/{args.restarts}", file=sys.stderr)
                wait_for(lambda: all(c.is_ready_now() for c in checkers), 30, "every checker ready")
            finally:
                stop.set()
                for t in threads:
                    t.join(15)
        um.systemctl("stop", unit)

    print(f"\n{args.restarts} restarts (`systemctl restart --no-block`) of a simulator unit "
          "(--load-seconds 2 --linger-seconds 2), all checkers in the same run\n")
    print("| checker | false-ready answers | restarts with a false ready | held-ready s (mean) | "
          "revocation lag p50 / p99 ms | detection lag p50 / p99 ms |")
    print("|---|---|---|---|---|---|")
    for c in checkers:
        false_answers, bad_restarts, held, revoke, detect = 0, 0, [], [], []
        for t_q, t_gen in windows:
            lies = sum(1 for sent, _, v in c.answers if t_q < sent < t_gen and v)
            false_answers += lies
            h = held_ready_seconds(c, t_q, t_gen)
            held.append(h)
            bad_restarts += 1 if lies else 0
            first_no = next((r for _, r, v in c.answers if r > t_q and not v), None)
            if first_no is not None:
                revoke.append(max(0.0, first_no - t_q))
            first_yes = next((r for s, r, v in c.answers if s >= t_gen and v), None)
            if first_yes is not None:
                detect.append(first_yes - t_gen)
        print(f"| {c.name} | {false_answers} | {bad_restarts}/{len(windows)} | {statistics.mean(held):.3f} | "
              f"{pct(revoke, 50) * 1000:.0f} / {pct(revoke, 99) * 1000:.0f} | "
              f"{pct(detect, 50) * 1000:.0f} / {pct(detect, 99) * 1000:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
