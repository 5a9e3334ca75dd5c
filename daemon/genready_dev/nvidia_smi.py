#!/usr/bin/env python3
"""A stand-in `nvidia-smi` for machines with no GPU: it answers the two queries genready makes in
the exact CSV of NVIDIA's documentation (`nvidia-smi --help-query-compute-apps`, `--help-query-gpu`;
https://manpages.ubuntu.com/manpages/noble/man1/nvidia-smi.1.html), from a JSON file a test writes:

    {"gpus": [{"index": 0, "uuid": "GPU-…", "memory_used_mib": 1024, "memory_total_mib": 143771,
               "utilization_pct": 0, "power_w": 70.5, "sm_clock_mhz": 345, "temperature_c": 30,
               "throttle": "0x0000000000000001"}],
     "apps": [{"gpu_uuid": "GPU-…", "pid": 1234, "used_mib": 81000}],
     "throttle_field": "clocks_throttle_reasons.active"}

A value of null prints as `[N/A]`, as the driver does. `throttle_field` is the only name of the
reasons field this "driver" knows (an older one knows only `clocks_throttle_reasons.active`, a
newer one both). Standard library only: it runs by its path, from `install`'s shim.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

STATE_ENV = "GENREADY_FAKE_SMI_STATE"
GPU_KEYS = {"index": "index", "uuid": "uuid", "memory.used": "memory_used_mib", "memory.total": "memory_total_mib",
            "utilization.gpu": "utilization_pct", "power.draw": "power_w", "clocks.sm": "sm_clock_mhz",
            "temperature.gpu": "temperature_c"}
APP_KEYS = {"gpu_uuid": "gpu_uuid", "pid": "pid", "used_memory": "used_mib"}


def install(bin_dir: Path, state: Path) -> Path:
    """Write an executable `nvidia-smi` into bin_dir that answers from `state`; its path."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    shim = bin_dir / "nvidia-smi"
    shim.write_text(f"#!/bin/sh\n{STATE_ENV}='{state}' exec '{sys.executable}' '{Path(__file__).resolve()}' \"$@\"\n")
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return shim


def write_state(state: Path, doc: dict[str, Any]) -> None:
    """Replace the state atomically: the stand-in never reads half a file."""
    tmp = state.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, state)


def _value(v: Any) -> str:
    return "[N/A]" if v is None else str(v)


def main(argv: list[str]) -> int:
    doc = json.loads(Path(os.environ[STATE_ENV]).read_text())
    query = next((a for a in argv if a.startswith("--query-")), None)
    if "--format=csv,noheader,nounits" not in argv or query is None:
        print("stand-in nvidia-smi: only --query-gpu / --query-compute-apps with --format=csv,noheader,nounits",
              file=sys.stderr)
        return 2
    kind, _, fields = query.partition("=")
    if kind == "--query-compute-apps":
        keys, rows = APP_KEYS, doc.get("apps", [])
    elif kind == "--query-gpu":
        throttle = doc.get("throttle_field", "clocks_throttle_reasons.active")
        keys, rows = {**GPU_KEYS, throttle: "throttle"}, doc.get("gpus", [])
    else:
        return 2
    names = fields.split(",")
    for name in names:
        if name not in keys:
            print(f'Field "{name}" is not a valid field to query.')  # as the real one says it
            return 2
    for row in rows:
        print(", ".join(_value(row.get(keys[n])) for n in names))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
