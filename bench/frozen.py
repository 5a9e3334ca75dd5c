#!/usr/bin/env python3
"""genready while its systemd manager is SIGSTOPped (issue 21 #4): a private manager of its own,
a simulator unit verified ready, then the manager frozen for a few seconds while /ready, /status
and /metrics are asked in turn, and continued. Prints the slowest answer of each while frozen
(goal: < 1 s) and the time from SIGCONT to /ready 200 (goal: < 1 s).

Run as root: .venv/bin/python bench/frozen.py [--seconds 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from genready_dev.harness import booted_manager
from genready_dev.hostile import frozen_manager


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=4.0, help="how long the manager stays stopped per round")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    with booted_manager() as um:
        for r in range(1, args.rounds + 1):
            f = frozen_manager(um, Path(tempfile.mkdtemp(prefix="genready-frozen-")), args.seconds)
            codes = sorted({c for _, c, _ in f.answers["/ready/t"]})
            print(f"round {r}: frozen {args.seconds:g} s: slowest /ready {f.slowest('/ready/t') * 1000:.0f} ms "
                  f"(codes {codes}, {len(f.answers['/ready/t'])} asked), /status {f.slowest('/status') * 1000:.0f} ms, "
                  f"/metrics {f.slowest('/metrics') * 1000:.0f} ms; /ready 200 {f.thaw_to_ready * 1000:.0f} ms "
                  "after SIGCONT", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
