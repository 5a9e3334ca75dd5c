#!/usr/bin/env python3
"""The cost of the real servers in `./dev test`: their builds, first and cached, and
the time tests/test_llamacpp.py adds to each of the four test runs.

- first build: as recorded when the cache was made (genready_dev.realservers writes each build's
  seconds next to it); `--fresh DIR` builds llama-server and the gguf tools again into an empty
  cache DIR and times that (~8 min on 2 cores; llama-cpp-python is not rebuilt: ~14 min);
- cached: `python -m genready_dev.realservers all` on the warm cache (what every later
  `./dev test` pays);
- per run: tests/test_llamacpp.py alone, in a pytest of its own (so its time includes booting the
  private systemd user manager, which the whole suite boots once anyway: printed apart).

Run as root: .venv/bin/python bench/realservers.py [--fresh /tmp/fresh-cache]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from genready_dev import realservers

REPO = Path(__file__).resolve().parents[1]


def timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.monotonic()
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    return time.monotonic() - start, r


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--fresh", metavar="DIR", help="also build llama-server into this empty cache and time it")
    args = p.parse_args()
    py = sys.executable
    for what in ("llama-server", "llama-cpp-python", "gguf"):
        took = realservers.build_seconds(what)
        print(f"first build, {what}: " + (f"{took:.0f} s (recorded)" if took is not None else "not recorded"))
    if args.fresh:
        env = {**os.environ, "GENREADY_DEV_CACHE": args.fresh}
        took, r = timed([py, "-m", "genready_dev.realservers", "gguf", "llama-server"], env)
        print(f"first build, llama-server from the sdist into {args.fresh}: {took:.0f} s (exit {r.returncode})")
    took, r = timed([py, "-m", "genready_dev.realservers", "all"])
    print(f"cached: realservers all: {took:.2f} s (exit {r.returncode})")
    took, r = timed([py, "-m", "pytest", "tests/test_llamacpp.py", "-q", "-p", "no:cacheprovider",
                     "--durations=0", "--durations-min=0"])
    setup = sum(float(m.group(1)) for m in re.finditer(r"^([0-9.]+)s setup .*test_llamacpp", r.stdout, re.M))
    last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr[-300:]
    print(f"per run: tests/test_llamacpp.py {took:.1f} s wall ({last}); of it setup {setup:.1f} s "
          "(the user manager's boot, shared by the whole suite, and the module's units and genready)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
