"""`genready demo --sweep`: a 2x2 benchmark sweep on the simulator, one verified start per server setting.

It boots a private `systemd --user` (usermanager.py), installs the simulator as sim.service
(its extra flags come from $SIM_FLAGS, which each point's drop-in sets) and genready as a
Type=notify unit, then runs `genready sweep` on a plan that varies the server's per-token
latency and the bench client's concurrency. The sweep's own progress lines and summary table
are shown as they come; then one line per point from the bench client's report.

The demo checks its story (exit 1 if it does not hold): every point ok, each point's benchmark
measured the PID the sweep verified for it, one start per server setting (the two concurrencies of
a token latency share it: one load per server configuration), and the unit ends on its own configuration with no
drop-in left. Everything is stopped and removed at the end, on success and on failure.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

import tomli_w

from genready_dev.demo import (
    GENREADY_SERVICE_TEXT,
    PY,
    SIM_UNIT,
    TARGET,
    DemoFailed,
    Layout,
    Style,
    exec_line,
    path_value,
    run_checked,
)
from genready_dev.harness import free_port
from genready_dev.usermanager import UserManager, unavailable_reason

GENREADY_UNIT: Final = "genready-demo.service"
LOAD_SECONDS: Final = 1.0  # each start "loads weights" this long: the sweep waits for it once per server setting
MATRIX: Final[dict[str, list[float]]] = {"token_latency": [0.002, 0.005], "concurrency": [1, 4]}
REQUESTS: Final = 24
MAX_TOKENS: Final = 16

SIM_TEXT: Final = """\
# {unit}: the demo's LLM server, genready's simulator. $SIM_FLAGS (empty here) is where a sweep
# point's drop-in puts its settings: `Environment=SIM_FLAGS=…` in a runtime drop-in.
[Unit]
Description=genready sweep demo: simulated LLM server
StartLimitIntervalSec=0

[Service]
Environment=SIM_FLAGS=
ExecStart={exec} $SIM_FLAGS
TimeoutStopSec=10
StandardOutput=append:{log}
StandardError=append:{log}
"""


def plan_text(url: str) -> str:
    """The demo's plan, written as a user would write it."""
    bench = shlex.join([PY, "-m", "genready.benchclient", "--url", url, "-n", str(REQUESTS), "--max-tokens",
                        str(MAX_TOKENS), "--label", "demo"])
    return f"""\
# genready demo --sweep: the server's per-token latency x the client's concurrency = 4 points
target = "{TARGET}"
timeout = 60
command = "{bench} -c {{concurrency}} --output {{out}}/bench.jsonl"
dropin = '''
[Service]
Environment="SIM_FLAGS=--token-latency {{token_latency}} --model sim-{{token_latency}}"
'''

[matrix]
token_latency = {MATRIX["token_latency"]}   # the server's seconds per generated token
concurrency = {MATRIX["concurrency"]}            # the bench client's requests in flight
"""


class SweepDemo:
    def __init__(self, *, keep: bool, style: Style) -> None:
        self.keep, self.s = keep, style
        self.started = time.monotonic()
        self.layout = Layout(Path(tempfile.mkdtemp(prefix="genready-sweep-demo-")))
        self.um = UserManager(root=self.layout.root)
        self.sim_port, self.api_port = free_port(), free_port()
        self.results = self.layout.root / "results"
        self.plan = self.layout.root / "plan.toml"

    def say(self, text: str = "") -> None:
        print(text, flush=True)

    def step(self, n: int, text: str) -> None:
        self.say(f"{self.s.bold(f'[{n}/4]')} {text}")

    def boot(self) -> None:
        self.say(self.s.bold("genready demo --sweep: a 2x2 benchmark sweep, one verified start per server setting"))
        self.step(1, f"Booting a private systemd --user manager in {self.layout.root} ...")
        try:
            self.um.start()
        except (RuntimeError, OSError, subprocess.SubprocessError) as e:
            raise DemoFailed(f"the private systemd user manager did not start: {e}") from e

    def install(self) -> None:
        L = self.layout
        for d in (L.genready_dir, L.state_dir, L.stamp_dir, L.logs):
            d.mkdir(parents=True, exist_ok=True)
        url = f"http://127.0.0.1:{self.sim_port}"
        cfg = {"daemon": {"listen": f"127.0.0.1:{self.api_port}", "bus": "user", "state_dir": str(L.state_dir),
                          "runtime_dir": str(L.stamp_dir), "log_level": "info"},
               "targets": {TARGET: {"unit": SIM_UNIT, "url": url, "backoff_initial": 0.1, "backoff_max": 0.5}}}
        L.config.write_text(tomli_w.dumps(cfg))
        genready = (PY, "-m", "genready.cli")
        env = self.um.env
        self.um.install_unit(SIM_UNIT, SIM_TEXT.format(
            unit=SIM_UNIT, log=path_value(L.log("sim")),
            exec=exec_line(*genready, "simulate", "--port", str(self.sim_port), "--load-seconds", f"{LOAD_SECONDS:g}")))
        self.um.install_unit(GENREADY_UNIT, GENREADY_SERVICE_TEXT.format(
            unit=GENREADY_UNIT, target_unit=SIM_UNIT, exec=exec_line(*genready, "serve", "--config", str(L.config)),
            env=" ".join(f"{k}={env[k]}" for k in ("XDG_RUNTIME_DIR", "DBUS_SESSION_BUS_ADDRESS")),
            start_timeout=60, log=path_value(L.log("genready"))))
        self.plan.write_text(plan_text(url))
        self.step(2, f"Installed {SIM_UNIT} (the simulator) and {GENREADY_UNIT}; starting both "
                  "(returns once genready verified the server) ...")
        for unit, log in ((SIM_UNIT, "sim"), (GENREADY_UNIT, "genready")):
            r = self.um.systemctl("start", unit, check=False, timeout=90)
            if r.returncode != 0:
                raise DemoFailed(f"systemctl --user start {unit} failed: {r.stderr.strip()}", logs=(log,))

    def sweep(self) -> subprocess.CompletedProcess[str]:
        self.step(3, f"The plan ({self.plan}):")
        self.say(self.s.dim("".join(f"      {ln}\n" for ln in self.plan.read_text().splitlines()).rstrip()))
        cmd = [PY, "-m", "genready.cli", "sweep", str(self.plan), "--results", str(self.results),
               "--config", str(self.layout.config)]
        self.step(4, "genready sweep plan.toml --results results/   (its own output follows)\n")
        sys.stdout.flush()
        # stdout and stderr pass through: the newcomer sees exactly what a user of `genready sweep` sees.
        return subprocess.run(cmd, env=self.um.env, text=True, timeout=300)

    def verdict(self, rc: int) -> None:
        lines = [json.loads(ln) for ln in (self.results / "results.jsonl").read_text().splitlines()]
        oks = [ln for ln in lines if ln["status"] == "ok"]
        self.say("\n" + self.s.bold("What the bench client measured, per point (from each point's bench.jsonl):"))
        rows = [["POINT", "VERIFIED PID", "MEASURED PID", "TTFT p50 ms", "ITL p50 ms", "tok/s", "req/s"]]
        wrong = []
        for ln in oks:
            rep: dict[str, Any] = json.loads((self.results / ln["out"] / "bench.jsonl").read_text().splitlines()[-1])
            measured = (rep.get("served_by") or {}).get("pid")
            if str(measured) != str(ln["pid"]):
                wrong.append(f"{ln['point']}: verified pid {ln['pid']}, benchmark measured {measured}")
            rows.append([" ".join(f"{k}={v}" for k, v in ln["point"].items()), str(ln["pid"]), str(measured),
                         _num(rep.get("ttft_p50_ms")), _num(rep.get("itl_p50_ms")),
                         _num(rep.get("output_tokens_per_second")), _num(rep.get("requests_per_second"))])
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for r in rows:
            self.say("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
        dropins = self.um.show(SIM_UNIT, "DropInPaths").get("DropInPaths", "")
        points = len(MATRIX["token_latency"]) * len(MATRIX["concurrency"])
        if rc != 0 or len({json.dumps(ln["point"], sort_keys=True) for ln in oks}) != points:
            raise DemoFailed(f"the sweep exited {rc} with {len(oks)} of {points} points ok", logs=("sim", "genready"))
        if wrong:
            raise DemoFailed("a benchmark measured another process than the verified one: " + "; ".join(wrong))
        starts: dict[object, set[int]] = {ln["point"]["token_latency"]: set() for ln in oks}
        for ln in oks:
            starts[ln["point"]["token_latency"]].add(ln["pid"])
        if len({pid for pids in starts.values() for pid in pids}) != len(starts) or any(len(p) != 1 for p in
                                                                                     starts.values()):
            raise DemoFailed(f"expected one verified start per server setting, found {starts}")
        if dropins:
            raise DemoFailed(f"a drop-in is left on {SIM_UNIT}: {dropins}")
        self.say("\n" + self.s.green("Shown and checked:") + " 4 points, each benchmarked on the server start the "
                 "sweep verified for it,\n  one start per server setting (2 loads, not 4); the drop-in is gone and "
                 "sim.service runs its own\n  configuration again.")
        self.say(f"  results.jsonl: {self.results / 'results.jsonl'}" + ("" if self.keep else " (--keep keeps it)"))

    def cleanup(self) -> list[str]:
        problems: list[str] = []
        if self.um.proc is not None and self.um.proc.poll() is None:
            with_timeout = self.um.systemctl("stop", GENREADY_UNIT, SIM_UNIT, check=False, timeout=30)
            if with_timeout.returncode != 0:
                problems.append(f"stopping the units: {with_timeout.stderr.strip()}")
        try:
            self.um.stop(timeout=30)
        except Exception as e:
            problems.append(f"stopping the private manager: {e}")
        if not self.keep:
            shutil.rmtree(self.layout.root, ignore_errors=True)
        return problems


def _num(v: object) -> str:
    return f"{v:.1f}" if isinstance(v, int | float) else "-"


def run(*, keep: bool = False) -> int:
    """The sweep demo; its exit status (0: shown and checked, 1: failed, 130: interrupted)."""
    style = Style(sys.stdout.isatty())
    reason = unavailable_reason()
    if reason:
        print(f"genready demo: cannot run here: {reason}", file=sys.stderr)
        return 1
    demo = SweepDemo(keep=keep, style=style)

    def story() -> None:
        demo.boot()
        demo.install()
        done = demo.sweep()
        demo.verdict(done.returncode)

    rc, problems = run_checked(demo, style, story)
    print(f"Cleaned up: stopped the units and the private manager. Sweep demo {'finished' if rc == 0 else 'FAILED'} "
          f"in {time.monotonic() - demo.started:.1f} s")
    return rc if not problems else (rc or 1)
