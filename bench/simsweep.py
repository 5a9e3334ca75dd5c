"""What the sweep benches share: `genready simulate` as a unit of a private systemd user manager, watched by a real
genready, its first start verified (`sim_target`); and one sweep of a plan on it (`sweep`).

Not a bench itself: bench/aa.py, repeats_auto.py, sweep_search.py and sweep_prune.py import it (a bench runs from
its own folder, so `import simsweep` finds it).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

import tomli_w

from genready_dev.harness import GENREADY, PY, Genready, booted_manager, free_port, wait_for
from genready_dev.usermanager import UserManager

UNIT: Final = "sweep-sim.service"


def simulate(port: int, load_seconds: float) -> str:
    """The unit's ExecStart= command line: the simulator on `port`, each load taking `load_seconds`."""
    return f"{PY} -m genready.cli simulate --port {port} --load-seconds {load_seconds:g}"


@contextmanager
def sim_target(tmp: Path, load_seconds: float, *, flags_env: bool = False) -> Iterator[tuple[UserManager, Genready,
                                                                                               str, int]]:
    """A fresh manager (its state under `tmp`) running the simulator as UNIT, and a genready watching it as target
    `sim` whose first start is verified: (manager, genready, url, port). `flags_env`: the unit's command line ends
    in $SIM_FLAGS (empty; a plan's drop-in sets it per point). The unit is stopped on the way out."""
    with booted_manager(tmp / "sd") as um:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        env = "Environment=SIM_FLAGS=\n" if flags_env else ""
        sim = simulate(port, load_seconds) + (" $SIM_FLAGS" if flags_env else "")
        um.install_unit(UNIT, f"[Unit]\nStartLimitIntervalSec=0\n[Service]\n{env}ExecStart={sim}\nTimeoutStopSec=10\n")
        um.systemctl("start", UNIT)
        try:
            with Genready(um, tmp, {"sim": {"unit": UNIT, "url": url, "backoff_initial": 0.05, "backoff_max": 0.3}},
                          log_level="info") as g:
                wait_for(lambda: g.get("/ready/sim")[0] == 200, 60, "the first start verified")
                yield um, g, url, port
        finally:
            um.systemctl("stop", UNIT)


def run_sweep(um: UserManager, g: Genready, plan: Path, results: Path, *flags: str,
              timeout: float = 3600) -> subprocess.CompletedProcess[str]:
    """`genready sweep PLAN --results RESULTS FLAGS` against `g`'s config, as the manager's user; exits the bench
    with the sweep's output unless it exited 0."""
    p = subprocess.run([*GENREADY, "sweep", str(plan), "--results", str(results), "--config", str(g.config_path),
                        *flags], env=um.env, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise SystemExit(f"the sweep exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def sweep(tmp: Path, name: str, doc: dict[str, Any], load_seconds: float = 0.3) -> tuple[Path, float]:
    """One sweep of the plan `doc` ({url} in it filled in) on a fresh manager and genready (sim_target with
    $SIM_FLAGS): its results folder and seconds."""
    t0 = time.monotonic()
    (tmp / name).mkdir()
    with sim_target(tmp / name, load_seconds, flags_env=True) as (um, g, url, _):
        plan = tmp / f"{name}.toml"
        plan.write_text(tomli_w.dumps(json.loads(json.dumps(doc).replace("{url}", url))))
        results = tmp / name / "results"
        run_sweep(um, g, plan, results, timeout=1800)
    return results, time.monotonic() - t0
