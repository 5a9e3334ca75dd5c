#!/usr/bin/env python3
"""genready's memory when a failed start follows a huge output file: a unit whose
StandardOutput=append: file holds SIZE MB before a start that fails while genready runs (genready
started mid-load, so it reads the file's own tail), genready a unit of a private manager with
MemoryMax=256M and in a 256 MiB memory cgroup where the host has one. Prints genready's RSS
before the failure and its peak after (goal: < 80 MB), and the last line it shows.

Run as root: .venv/bin/python bench/tail_rss.py [--mb 200]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from genready_dev.harness import booted_manager
from genready_dev.hostile import huge_output_failure


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=int, default=200, help="size of the output file before the failed start (MB)")
    args = p.parse_args()
    with booted_manager() as um:
        r = huge_output_failure(um, Path(tempfile.mkdtemp(prefix="genready-tail-")), args.mb << 20)
    shown = r.lines[-1] if r.lines else "(none)"
    print(f"output file {args.mb} MB: genready RSS {r.rss_before_kb / 1024:.1f} MB before the failure, peak "
          f"{r.peak_kb / 1024:.1f} MB after; survived: {r.survived}; memory cgroup: {r.cgroup or 'none'}; "
          f"last line shown: {shown!r}")
    return 0 if r.survived and r.lines else 1


if __name__ == "__main__":
    raise SystemExit(main())
