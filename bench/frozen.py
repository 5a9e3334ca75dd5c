#!/usr/bin/env python3
"""genready while its systemd manager is SIGSTOPped: a private manager of its own,
a simulator unit verified ready, then the manager frozen for a few seconds while /ready, /status
and /metrics are asked in turn, and continued. Prints the slowest answer of each while frozen
(goal: < 1 s) and the time from SIGCONT to /ready 200 (goal: < 1 s).

The "re-read" rounds freeze the manager just as the watcher is to re-read every unit after a
daemon-reload (hostile.frozen_manager(during_reread=True)): the moment its pystemd connection,
which keeps the GIL while it waits, would ask a frozen manager.

Run as root: .venv/bin/python bench/frozen.py [--seconds 4] [--rounds 3] [--reread-rounds 2]
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
    p.add_argument("--rounds", type=int, default=3, help="rounds frozen while genready is idle")
    p.add_argument("--reread-rounds", type=int, default=2, help="rounds frozen as the watcher re-reads")
    args = p.parse_args()
    with booted_manager() as um:
        kinds = ["idle"] * args.rounds + ["re-read"] * args.reread_rounds
        for r, kind in enumerate(kinds, 1):
            f = frozen_manager(um, Path(tempfile.mkdtemp(prefix="genready-frozen-")), args.seconds,
                               during_reread=kind == "re-read")
            codes = sorted({c for _, c, _ in f.answers["/ready/t"]})
            print(f"round {r} ({kind}): frozen {args.seconds:g} s: "
                  f"slowest /ready {f.slowest('/ready/t') * 1000:.0f} ms "
                  f"(codes {codes}, {len(f.answers['/ready/t'])} asked), /status {f.slowest('/status') * 1000:.0f} ms, "
                  f"/metrics {f.slowest('/metrics') * 1000:.0f} ms; /ready 200 {f.thaw_to_ready * 1000:.0f} ms "
                  "after SIGCONT", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
