"""`genready demo`: the restart race, shown live in a private systemd user manager.

One command, on a fresh machine, as root: it boots a private `systemd --user` (see
usermanager.py), installs a simulated LLM server imitating SGLang, genready itself as a
Type=notify unit, and the benchmark .path/.service pair; then it restarts the server the
way a racy reconfigure script does and prints a timeline of what a naive `/v1/models`
poller concluded, what genready's /ready answered, what the server processes did and what
the path-triggered benchmark measured. Everything it started is stopped and removed at the
end, on success and on failure.

The demo also checks its own story (exit 1 if it does not hold): the naive check said READY
on the old process, genready never said READY for anything but the new process, and the
benchmark measured the new process.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Final, Protocol

import tomli_w

from genready.client import client
from genready.probe.owner import find_owner
from genready.vocab import State
from genready_dev.harness import free_port
from genready_dev.usermanager import UserManager, unavailable_reason

TARGET: Final = "sim"
SIM_UNIT: Final = "sim.service"
GENREADY_UNIT: Final = "genready-demo.service"
BENCH_TEMPLATE: Final = "genready-bench@"
BENCH_PATH: Final = f"{BENCH_TEMPLATE}{TARGET}.path"
BENCH_SERVICE: Final = f"{BENCH_TEMPLATE}{TARGET}.service"
PY: Final = sys.executable

# How often the observers look. The naive poller is as eager as a tight `until curl …` loop;
# genready's /ready is cheap (one systemd read), so it is polled often for a precise timeline.
NAIVE_INTERVAL: Final = 0.1
GENREADY_INTERVAL: Final = 0.025
TAIL_INTERVAL: Final = 0.01


@dataclass(frozen=True)
class Settings:
    load_seconds: float
    linger_seconds: float
    bench_requests: int
    token_latency: float  # seconds per generated token: makes the benchmark's numbers look like a server's


FULL: Final = Settings(load_seconds=15.0, linger_seconds=5.0, bench_requests=40, token_latency=0.005)
FAST: Final = Settings(load_seconds=3.0, linger_seconds=1.5, bench_requests=20, token_latency=0.002)


class DemoFailed(Exception):
    """A step of the demo failed: the message says which and why; `logs` names what to show."""

    def __init__(self, message: str, logs: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.logs = logs


# -- the units ---------------------------------------------------------------------------------

INSTANCE: Final = "%i"  # the one specifier the demo's Exec lines mean: the template's instance name


def exec_arg(s: str) -> str:
    """One word of an Exec*= line: `%` and `$` escaped (specifiers, variables), quoted if needed."""
    if s == INSTANCE:
        return s
    s = s.replace("%", "%%").replace("$", "$$")
    if re.fullmatch(r"[A-Za-z0-9_@%+=:,./-]+", s):
        return s
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def exec_line(*words: str) -> str:
    return " ".join(exec_arg(w) for w in words)


def path_value(p: Path) -> str:
    """A path as a unit-file value (no word splitting there, but specifiers are expanded)."""
    return str(p).replace("%", "%%")


SIM_SERVICE_TEXT: Final = """\
# {unit}: the demo's LLM server: genready's simulator imitating SGLang. It loads "weights" for
# {load:g} s before it binds its port, and after SIGTERM the old process keeps serving for {linger:g} s:
# the two behaviours that make naive readiness checks lie during a restart.
[Unit]
Description=genready demo: simulated LLM server (SGLang-like)

[Service]
Type=exec
ExecStart={exec}
# Longer than the linger, so the old process ends by itself, as it would on a real host.
TimeoutStopSec=30
# There is no journald in the private manager: keep the output (its lifecycle lines) in a file.
StandardOutput=append:{log}
StandardError=append:{log}
"""

GENREADY_SERVICE_TEXT: Final = """\
# {unit}: genready itself, as units/genready.service runs it (Type=notify, NotifyAccess=main),
# watching the private user manager (bus = "user") instead of the system manager. The hardening
# of the shipped unit is left out: it is tested in tests/test_units.py, and this unit runs the
# checkout's interpreter out of a temporary directory.
[Unit]
Description=genready (demo): readiness of {target_unit}, proven by a real generation

[Service]
Type=notify
NotifyAccess=main
ExecStart={exec}
# genready finds the private manager's bus through these.
Environment={env}
# The shipped unit says infinity (a model load can take hours); the demo would rather fail than hang.
TimeoutStartSec={start_timeout:g}
TimeoutStopSec=10
StandardOutput=append:{log}
StandardError=append:{log}
"""

BENCH_PATH_TEXT: Final = """\
# {template}.path, as units/genready-bench@.path: run the benchmark each time genready rewrites
# the ready stamp of %i (an atomic rename, once per verified start). PathChanged=, never
# PathExists= (that one re-triggers after every run while the stamp exists).
[Unit]
Description=genready demo: benchmark trigger on the ready stamp of %i

[Path]
PathChanged={stamp_dir}/%i.ready
Unit={template}%i.service
"""

BENCH_SERVICE_TEXT: Final = """\
# {template}.service, as units/genready-bench@.service: the benchmark runs only while genready
# says %i is ready (ExecCondition: any exit 1-254 skips the run cleanly), and `genready guard`
# fails the run (exit 75) if %i's readiness changed while it ran. The benchmark client's output
# is appended to a log file (there is no journald here).
[Unit]
Description=genready demo: benchmark of %i, gated on genready's readiness
Wants={genready_unit}
After={genready_unit}
# A restart sweep triggers this often; the default start limit would fail the path unit for good.
StartLimitIntervalSec=0

[Service]
Type=oneshot
ExecCondition={condition}
ExecStart={start}
StandardOutput=append:{log}
StandardError=append:{log}
"""


@dataclass(frozen=True)
class Layout:
    """Where everything of one demo run lives, all under one temporary directory."""

    root: Path

    @property
    def genready_dir(self) -> Path:
        return self.root / "genready"

    @property
    def config(self) -> Path:
        return self.genready_dir / "genready.toml"

    @property
    def state_dir(self) -> Path:
        return self.genready_dir / "state"

    @property
    def stamp_dir(self) -> Path:
        return self.genready_dir / "run"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def log(self, name: str) -> Path:
        return self.logs / f"{name}.log"


def genready_config(layout: Layout, api_port: int, sim_port: int) -> str:
    cfg = {
        "daemon": {"listen": f"127.0.0.1:{api_port}", "bus": "user", "state_dir": str(layout.state_dir),
                   "runtime_dir": str(layout.stamp_dir), "log_level": "info"},
        "targets": {TARGET: {"unit": SIM_UNIT, "url": f"http://127.0.0.1:{sim_port}", "api": "sglang"}},
    }
    return ("# genready demo configuration: one target, the simulator; everything else at its default\n"
            "# (config/genready.toml documents every key).\n" + tomli_w.dumps(cfg))


def unit_texts(layout: Layout, um: UserManager, s: Settings, api_port: int, sim_port: int) -> dict[str, str]:
    """The four demo units, with paths rewritten to this run's directory and this interpreter."""
    genready = (PY, "-m", "genready.cli")
    cfg = str(layout.config)
    sim_exec = exec_line(*genready, "simulate", "--port", str(sim_port), "--load-seconds", f"{s.load_seconds:g}",
                         "--linger-seconds", f"{s.linger_seconds:g}", "--token-latency", f"{s.token_latency:g}")
    bench_cmd = (PY, "-m", "genready.benchclient", "--target", INSTANCE, "--url", f"http://127.0.0.1:{sim_port}",
                 "--api", "sglang", "-n", str(s.bench_requests), "-c", "4", "--max-tokens", "32", "--timeout", "10")
    env = um.env
    bus_env = " ".join(exec_arg(f"{k}={env[k]}") for k in ("XDG_RUNTIME_DIR", "DBUS_SESSION_BUS_ADDRESS"))
    return {
        SIM_UNIT: SIM_SERVICE_TEXT.format(unit=SIM_UNIT, load=s.load_seconds, linger=s.linger_seconds,
                                          exec=sim_exec, log=path_value(layout.log("sim"))),
        GENREADY_UNIT: GENREADY_SERVICE_TEXT.format(
            unit=GENREADY_UNIT, target_unit=SIM_UNIT, exec=exec_line(*genready, "serve", "--config", cfg),
            env=bus_env, start_timeout=s.load_seconds + 60, log=path_value(layout.log("genready"))),
        f"{BENCH_TEMPLATE}.path": BENCH_PATH_TEXT.format(template=BENCH_TEMPLATE,
                                                         stamp_dir=path_value(layout.stamp_dir)),
        f"{BENCH_TEMPLATE}.service": BENCH_SERVICE_TEXT.format(
            template=BENCH_TEMPLATE, genready_unit=GENREADY_UNIT,
            condition=exec_line(*genready, "wait", "--config", cfg, INSTANCE, "--timeout", "0"),
            # Options before TARGET: `guard` hands everything after TARGET to the command.
            start=exec_line(*genready, "guard", "--config", cfg, INSTANCE, "--", *bench_cmd),
            log=path_value(layout.log("bench"))),
    }


# -- output ------------------------------------------------------------------------------------

class Style:
    """ANSI colour when stdout is a terminal, plain text otherwise (logs, pipes, tests)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def _sgr(self, code: str, s: str) -> str:
        return f"\033[{code}m{s}\033[0m" if self.enabled and s else s

    def bold(self, s: str) -> str:
        return self._sgr("1", s)

    def dim(self, s: str) -> str:
        return self._sgr("2", s)

    def red(self, s: str) -> str:
        return self._sgr("1;31", s)

    def green(self, s: str) -> str:
        return self._sgr("1;32", s)

    def yellow(self, s: str) -> str:
        return self._sgr("33", s)

    def cyan(self, s: str) -> str:
        return self._sgr("36", s)


def _utf8(stream: Any) -> bool:
    return "utf" in (getattr(stream, "encoding", "") or "").lower()


# -- observing the restart ---------------------------------------------------------------------

@dataclass(frozen=True)
class Event:
    t: float  # time.monotonic() when observed
    source: str  # script, sim, naive, genready, bench
    kind: str
    pid: int | None = None
    text: str = ""
    data: dict[str, Any] = field(default_factory=dict)


class Tail:
    """New complete lines of a growing file, from a starting offset."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0
        self._partial = b""

    def lines(self) -> list[str]:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(chunk)
        data = self._partial + chunk
        *complete, self._partial = data.split(b"\n")
        return [line.decode(errors="replace") for line in complete]


SIM_LINE: Final = re.compile(r"^genready-sim\[(\d+)\] t=\S+ (\w+)(.*)$")
SIM_FIELD: Final = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')


def sim_fields(rest: str) -> dict[str, str]:
    out = {}
    for k, v in SIM_FIELD.findall(rest):
        out[k] = json.loads(v) if v.startswith('"') else v
    return out


def naive_check(port: int, hint_pid: int) -> tuple[bool, int | None, str]:
    """What `curl -sf /v1/models` tells a script: (answered 200, who answered it, why not).

    The script never learns who answered; the demo does, to show it: while the connection is
    still open, the server side of it is looked up (genready.probe.owner, the probe's own proof).
    """
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1.0)
    try:
        conn.request("GET", "/v1/models")
        resp = conn.getresponse()
        resp.read()
        if resp.status != 200:
            return False, None, f"HTTP {resp.status}"
        if conn.sock is None:  # the server closed the connection: nobody to look up
            return True, None, ""
        local, peer = conn.sock.getsockname()[:2], conn.sock.getpeername()[:2]
        return True, find_owner(local, peer, hint_pid).pid, ""
    except (OSError, http.client.HTTPException) as e:
        why = os.strerror(e.errno).lower() if isinstance(e, OSError) and e.errno else str(e) or type(e).__name__
        return False, None, why
    finally:
        conn.close()


# benchclient's header: "benchclient: N requests at concurrency C to URL (…)[, target T][, label L][, pid P]".
BENCH_HEADER = re.compile(r"benchclient: \d+ requests at concurrency \d+ to .*?(?:, pid (\d+))?$")


class Watch:
    """Observer threads around the restart; their findings arrive as timestamped Events."""

    def __init__(self, sim_port: int, api_base: str, sim_log: Path, bench_log: Path) -> None:
        self.sim_port = sim_port
        self.api_base = api_base
        self.sim_tail = Tail(sim_log)
        self.bench_tail = Tail(bench_log)
        self.events: list[Event] = []
        self.errors: list[str] = []
        self.changed = threading.Event()
        self.stop = threading.Event()
        self._new: list[Event] = []
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._bench: dict[str, Any] = {}
        self.hint_pid = 0

    def add(self, ev: Event) -> None:
        with self._lock:
            self.events.append(ev)
            self._new.append(ev)
        self.changed.set()

    def all_events(self) -> list[Event]:
        with self._lock:
            return list(self.events)

    def drain(self) -> list[Event]:
        with self._lock:
            new, self._new = self._new, []
        return sorted(new, key=lambda e: e.t)

    def spawn(self, name: str, loop: Callable[[], None]) -> None:
        def run() -> None:
            try:
                loop()
            except Exception as e:  # reported by the main thread, which owns the output
                self.errors.append(f"{name}: {type(e).__name__}: {e}")
                self.changed.set()

        t = threading.Thread(target=run, name=f"demo-{name}", daemon=True)
        t.start()
        self._threads.append(t)

    def close(self) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(5)

    # -- the loops -------------------------------------------------------------------------------

    def tails(self) -> None:
        while not self.stop.wait(TAIL_INTERVAL):
            for line in self.sim_tail.lines():
                self._sim_line(line)
            for line in self.bench_tail.lines():
                self._bench_line(line)

    def naive(self) -> None:
        last: tuple[bool, int | None, str] | None = None
        while not self.stop.is_set():
            ok, pid, why = naive_check(self.sim_port, self.hint_pid)
            t = time.monotonic()
            now = (ok, pid, "" if ok else why)
            if now != last:
                self.add(Event(t, "naive", "ready" if ok else "down", pid, why))
                last = now
            self.stop.wait(NAIVE_INTERVAL)

    def genready(self) -> None:
        last: tuple[object, ...] | None = None
        while not self.stop.is_set():
            try:
                code, body = client.request(self.api_base, f"/ready/{TARGET}", timeout=2.0)
            except client.Unreachable as e:
                code, body = 0, {"error": str(e)}
            t = time.monotonic()
            body = body if isinstance(body, dict) else {}
            state = str(body.get("state") or "")
            pid = body.get("pid") if isinstance(body.get("pid"), int) else None
            # One row per change of verdict; pids matter once a process is being probed.
            key: tuple[object, ...] = (code, pid) if code == 200 else (
                code, state, pid if state in (State.LOADING, State.WARMING, State.STUCK) else None)
            if key != last:
                if code == 200:
                    self.add(Event(t, "genready", "ready", pid, data={"load": body.get("load_seconds")}))
                else:
                    self.add(Event(t, "genready", "not-ready", pid, str(body.get("reason") or body.get("error") or ""),
                                   data={"code": code, "state": state or "unreachable"}))
                last = key
            self.stop.wait(GENREADY_INTERVAL)

    def _sim_line(self, line: str) -> None:
        m = SIM_LINE.match(line)
        if not m:
            return
        t, pid, what, f = time.monotonic(), int(m[1]), m[2], sim_fields(m[3])
        if what == "lingering" and f.get("repeated") != "yes":
            self.add(Event(t, "sim", "lingering", pid, data={"seconds": float(f.get("seconds", 0))}))
        elif what == "exiting":
            self.add(Event(t, "sim", "exited", pid))
        elif what == "loading":
            self.add(Event(t, "sim", "loading", pid, data={"seconds": float(f.get("seconds", 0))}))
        elif what == "ready":
            self.add(Event(t, "sim", "ready", pid))
        elif what in ("error", "crashing", "hanging"):
            self.add(Event(t, "sim", "trouble", pid, f"{what} {f.get('msg', '')}".strip()))

    def _bench_line(self, line: str) -> None:
        t = time.monotonic()
        if line.startswith("genready: ") and "not ready" in line:
            # `genready wait --timeout 0` in ExecCondition, run because the path unit fired.
            self.add(Event(t, "bench", "skipped", text=line.removeprefix("genready: ")))
        elif line.startswith("genready guard:"):
            self.add(Event(t, "bench", "guard", text=line.removeprefix("genready guard: ")))
        elif m := BENCH_HEADER.match(line):
            # The first line of its result block, printed as it starts; its progress lines
            # ("benchclient: 3/10 done") and complaints also start with "benchclient:" and are no start.
            self._bench = {}
            self.add(Event(t, "bench", "started", int(m[1]) if m[1] else None))
        elif m := re.match(r"\s+requests\s+(\d+) ok, (\d+) failed", line):
            self._bench.update(ok=int(m[1]), failed=int(m[2]))
        elif m := re.match(r"\s+rate\s+(\S+) requests/s, (\S+) tokens/s", line):
            self._bench.update(rps=float(m[1]), tps=float(m[2]))
        elif m := re.match(r"\s+latency\s+p50 (\S+)", line):
            self._bench.update(p50=m[1])
        elif m := re.match(r"\s+served by pid (\d+)", line):
            self.add(Event(t, "bench", "result", int(m[1]), data=dict(self._bench)))


# -- the timeline ------------------------------------------------------------------------------

class Timeline:
    """Renders events as rows: time, what each check says right after the event, and the event."""

    TIME_W, NAIVE_W, GENREADY_W = 8, 10, 14

    def __init__(self, style: Style, t0: float, old_pid: int) -> None:
        self.s = style
        self.t0 = t0
        self.old_pid = old_pid
        self.new_pid: int | None = None
        self.new_can_generate: float | None = None
        self.naive = "-"
        self.naive_wrong = False
        self.genready = f"READY {old_pid}"
        self.seen_naive_ready = False
        self.wrong = "✗" if _utf8(sys.stdout) else "x"

    def header(self) -> str:
        s = self.s
        top = f"{'':>{self.TIME_W}}  {'NAIVE':<{self.NAIVE_W}}  {'GENREADY':<{self.GENREADY_W}}"
        sub = f"{'TIME':>{self.TIME_W}}  {'/v1/models':<{self.NAIVE_W}}  {'/ready/' + TARGET:<{self.GENREADY_W}}  "
        return s.bold(top.rstrip()) + "\n" + s.bold(sub + "WHAT HAPPENED")

    def _cells(self) -> str:
        s = self.s
        naive = f"{self.naive:<{self.NAIVE_W}}"
        if self.naive.startswith("READY"):
            naive = s.red(naive) if self.naive_wrong else s.green(naive)
        gr = f"{self.genready:<{self.GENREADY_W}}"
        gr = s.green(gr) if self.genready.startswith("READY") else s.yellow(gr)
        return f"{naive}  {gr}"

    def row(self, ev: Event) -> str:
        text = self.describe(ev)  # updates the cells first
        tag = {"script": self.s.bold, "sim": self.s.cyan, "naive": self.s.bold, "genready": self.s.bold,
               "bench": self.s.bold}[ev.source](f"{ev.source}:")
        return f"{f'{ev.t - self.t0:+.2f}s':>{self.TIME_W}}  {self._cells()}  {tag} {text}"

    def describe(self, ev: Event) -> str:
        k, pid = ev.kind, ev.pid
        if ev.source == "script":
            return ev.text
        if ev.source == "sim":
            if k == "lingering":
                return f"old pid {pid} got SIGTERM; it keeps serving for {ev.data['seconds']:g} s"
            if k == "exited":
                return f"{'old ' if pid == self.old_pid else ''}pid {pid} exited"
            if k == "loading":
                if pid != self.old_pid:
                    self.new_pid = pid
                return f"new pid {pid}: loading weights for {ev.data['seconds']:g} s (port not bound yet)"
            if k == "ready":
                if pid == self.new_pid:
                    self.new_can_generate = ev.t
                return f"new pid {pid} finished loading: it can generate now"
            return f"pid {pid}: {ev.text}"
        if ev.source == "naive":
            if k == "down":
                self.naive, self.naive_wrong = "waiting", False
                return f"GET /v1/models: {ev.text}"
            self.naive = "READY"
            # Wrong when the answer did not come from the new process (or, if we could not
            # tell who answered, when the new process could not generate yet).
            self.naive_wrong = pid != self.new_pid if pid is not None else self.new_can_generate is None
            if self.naive_wrong:
                self.naive = f"READY {self.wrong}"
            first, self.seen_naive_ready = not self.seen_naive_ready, True
            who = ("the OLD pid" if pid == self.old_pid else "the NEW pid" if pid == self.new_pid
                   else "pid") + f" {pid}" if pid else "an unknown process"
            if first:
                return f"200 from {who}: the script says READY and starts its benchmark"
            return f"200 again, from {who}"
        if ev.source == "genready":
            if k == "ready":
                self.genready = f"READY {pid}"
                load = ev.data.get("load")
                tail = f" (load {load:.1f} s)" if isinstance(load, int | float) else ""
                return f"READY: pid {pid} served a real generation{tail}"
            code, state = ev.data["code"], ev.data["state"]
            self.genready = f"{code or '---'} {state}"
            # The pid is systemd's MainPID: genready knows a new process before it logs anything.
            return f"{code or 'unreachable'}, not ready" + (f" (pid {pid})" if pid else "") + f": {ev.text or state}"
        if k == "skipped":
            return "stamp removed, path unit fired; ExecCondition `genready wait` said not ready: run skipped"
        if k == "guard":
            return f"guard: {ev.text}"
        if k == "started":
            return f"{BENCH_SERVICE} started by the path unit; guard pinned pid {pid}"
        d = ev.data
        return (f"{d.get('ok', '?')}/{d.get('ok', 0) + d.get('failed', 0)} requests ok, {d.get('rps', 0):.1f} req/s, "
                f"p50 {d.get('p50', '?')} ms; measured pid {pid}")


# -- the demo ----------------------------------------------------------------------------------

def tail_text(path: Path, lines: int = 12) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"({e})"


class Demo:
    def __init__(self, settings: Settings, *, keep: bool, style: Style) -> None:
        self.st = settings
        self.keep = keep
        self.s = style
        self.started = time.monotonic()
        self.layout = Layout(Path(tempfile.mkdtemp(prefix="genready-demo-")))
        self.um = UserManager(root=self.layout.root)
        self.sim_port = free_port()
        self.api_port = free_port()
        self.api_base = f"http://127.0.0.1:{self.api_port}"
        self.watch: Watch | None = None

    def say(self, text: str = "") -> None:
        print(text, flush=True)

    def step(self, n: int, text: str) -> None:
        self.say(f"{self.s.bold(f'[{n}/5]')} {text}")

    # -- phases ----------------------------------------------------------------------------------

    def intro(self) -> None:
        st, b = self.st, self.s.bold
        self.say(b("genready demo: a restart race, and what genready says about it"))
        self.say(f"""
An LLM server runs as a systemd unit: here genready's simulator imitating SGLang. It loads
its weights for {st.load_seconds:g} s before it binds its port, and after SIGTERM the old process keeps
serving for {st.linger_seconds:g} s. A reconfigure script restarts it and polls /v1/models until it
answers, then benchmarks. Watch that check say READY while only the OLD process answers.
genready watches the same unit and says READY only once the NEW MainPID has served a real
generation; then a .path unit starts the benchmark under `genready guard`.
Everything runs in a private systemd user manager; the host's systemd is not touched.
""")

    def boot(self) -> None:
        self.step(1, f"Booting a private systemd --user manager in {self.layout.root} ...")
        t = time.monotonic()
        try:
            self.um.start()
        except (RuntimeError, OSError, subprocess.SubprocessError) as e:
            raise DemoFailed(f"the private systemd user manager did not start: {e}") from e
        self.say(f"      ok ({time.monotonic() - t:.1f} s)")

    def install(self) -> None:
        L = self.layout
        for d in (L.genready_dir, L.state_dir, L.stamp_dir, L.logs):
            d.mkdir(parents=True, exist_ok=True)
        for name in ("sim", "genready", "bench"):
            L.log(name).touch()
        L.config.write_text(genready_config(L, self.api_port, self.sim_port))
        texts = unit_texts(L, self.um, self.st, self.api_port, self.sim_port)
        for name, text in texts.items():
            self.um.install_unit(name, text)
        self.step(2, f"Installed {', '.join(texts)}\n      in {self.um.unit_dir}")

    def start_services(self) -> int:
        self.step(3, f"Starting {SIM_UNIT}, then {GENREADY_UNIT} (Type=notify: `systemctl start` returns\n"
                  "      when genready sends READY=1, i.e. once the server served a real generation) ...")
        t = time.monotonic()
        self._systemctl("start", SIM_UNIT, logs=("sim",))
        timeout = self.st.load_seconds + 60
        self._systemctl_waiting("start", GENREADY_UNIT, timeout=timeout, logs=("genready", "sim"))
        took = time.monotonic() - t
        code, body = self._ready()
        if code != 200:
            raise DemoFailed(f"{GENREADY_UNIT} started but /ready/{TARGET} answers {code}: {body}",
                             logs=("genready",))
        pid = int(body["pid"])
        main_pid = int(self.um.show(SIM_UNIT, "MainPID").get("MainPID", "0"))
        if pid != main_pid:
            raise DemoFailed(f"genready says pid {pid} is ready but {SIM_UNIT}'s MainPID is {main_pid}",
                             logs=("genready",))
        load = body.get("load_seconds")
        self.say(f"      ok: `systemctl start {GENREADY_UNIT}` returned after {self.s.bold(f'{took:.1f} s')}: "
                 f"pid {pid} served a generation" + (f" (load {load:.1f} s)" if load else ""))
        return pid

    def start_path_unit(self) -> None:
        self._systemctl("start", BENCH_PATH, logs=())
        self.step(4, f"Started {BENCH_PATH}: each rewrite of the ready stamp {TARGET}.ready\n"
                  f"      starts {BENCH_SERVICE}")

    def restart(self, old_pid: int) -> Timeline:
        st, s = self.st, self.s
        self.step(5, f"Restarting {SIM_UNIT} the racy way: `systemctl --user restart --no-block`, then "
                  "poll /v1/models\n")
        L = self.layout
        watch = self.watch = Watch(self.sim_port, self.api_base, L.log("sim"), L.log("bench"))
        watch.hint_pid = old_pid
        watch.spawn("tails", watch.tails)  # before the restart: the old process's SIGTERM line is soon
        t0 = time.monotonic()
        tl = Timeline(s, t0, old_pid)
        self.say(s.bold("TIMELINE") + " in seconds since the restart. NAIVE: what a script polling /v1/models "
                 f"concludes\n({tl.wrong}: READY while the new server cannot generate). GENREADY: what "
                 f"GET /ready/{TARGET} answers.\n")
        self.say(tl.header())
        self._systemctl("restart", "--no-block", SIM_UNIT, logs=("sim",))
        watch.add(Event(t0, "script", "restart", text=f"systemctl --user restart --no-block {SIM_UNIT} "
                        f"(returned after {(time.monotonic() - t0) * 1000:.0f} ms: job queued)"))
        # Like the script, the pollers start once systemctl returned.
        watch.spawn("naive", watch.naive)
        watch.spawn("genready", watch.genready)

        deadline = t0 + st.linger_seconds + st.load_seconds + 30
        ticker = Ticker(s.enabled)
        gr_ready_new: float | None = None
        try:
            while True:
                watch.changed.clear()  # before draining: an event added meanwhile wakes the wait below
                new = watch.drain()
                if new:
                    ticker.clear()
                for ev in new:
                    self.say(tl.row(ev))
                    if ev.source == "genready" and ev.kind == "ready" and ev.pid == tl.new_pid:
                        gr_ready_new = ev.t
                    if ev.source == "naive" and ev.pid:
                        watch.hint_pid = ev.pid
                if watch.errors:
                    raise DemoFailed(f"an observer failed: {watch.errors[0]}")
                if gr_ready_new is not None and any(
                        e.source == "bench" and e.kind in ("result", "guard") and e.t > gr_ready_new
                        for e in watch.all_events()):
                    break
                if time.monotonic() > deadline:
                    raise DemoFailed(self._stuck_reason(tl, gr_ready_new), logs=("genready", "sim", "bench"))
                ticker.show(f"{time.monotonic() - t0:+.1f}s  {self._waiting_for(tl, gr_ready_new)}")
                watch.changed.wait(0.2)  # also the ticker's refresh interval
        finally:
            ticker.clear()
            watch.close()
        for ev in watch.drain():
            self.say(tl.row(ev))
        self.say()
        return tl

    def verdict(self, tl: Timeline) -> None:
        """Check the story the timeline tells; print the verdict, or raise naming what did not hold."""
        assert self.watch is not None
        evs = self.watch.all_events()
        new, old = tl.new_pid, tl.old_pid
        if new is None or tl.new_can_generate is None:
            raise DemoFailed("the new server process never finished loading", logs=("sim",))
        can = tl.new_can_generate
        naive = next((e for e in evs if e.source == "naive" and e.kind == "ready"), None)
        gr_wrong = [e for e in evs if e.source == "genready" and e.kind == "ready" and e.pid != new]
        gr = next((e for e in evs if e.source == "genready" and e.kind == "ready" and e.pid == new), None)
        bench = [e for e in evs if e.source == "bench" and e.kind in ("result", "guard")]
        problems = []
        if gr_wrong:
            problems.append(f"genready said READY for pid {gr_wrong[0].pid} at {gr_wrong[0].t - tl.t0:+.2f}s, "
                            f"which is not the new pid {new}")
        if gr is None:
            problems.append(f"genready never said READY for the new pid {new}")
        elif gr.t < can - 0.05:  # the margin covers the observers' polling, not genready
            problems.append(f"genready said READY {can - gr.t:.2f} s before the new pid {new} could generate")
        if not bench or bench[-1].kind != "result" or bench[-1].pid != new:
            problems.append(f"the path-triggered benchmark did not report measuring the new pid {new}: "
                            f"{tl.describe(bench[-1]) if bench else 'no run'}")
        elif bench[-1].data.get("failed", 1):
            problems.append(f"the benchmark had failed requests: {bench[-1].data}")
        if naive is None or (naive.pid is not None and naive.pid != old) or naive.t >= can:
            # Not a genready bug, but then the demo did not show what it promises.
            problems.append("the naive check never said READY while the old process lingered "
                            f"(first naive READY: {'none' if naive is None else f'pid {naive.pid}'})")
        if problems:
            raise DemoFailed("the timeline does not show what it should:\n  - " + "\n  - ".join(problems),
                             logs=("genready", "sim", "bench"))
        assert gr is not None and naive is not None
        s = self.s
        self.say(s.bold("VERDICT") + "  the naive /v1/models check said READY "
                 + s.red(f"{can - naive.t:.1f} s before") + " the new server could generate\n"
                 + f"         (the OLD pid {old} answered it); genready said READY "
                 + s.green(f"{gr.t - can:.1f} s after") + " it could,\n"
                 + f"         naming the NEW pid {new}, and the benchmark it triggered measured pid {new}.\n")

    def where_next(self) -> None:
        s, L = self.s, self.layout
        self.say(s.bold("Where to look next") + " (output captured now, before the demo cleans up)")
        self.say(f"  $ genready status --url {self.api_base}")
        out = subprocess.run([PY, "-m", "genready.cli", "status", "--url", self.api_base], capture_output=True,
                             text=True, timeout=30)
        for line in (out.stdout or out.stderr).rstrip().splitlines():
            self.say(f"    {line}".rstrip())
        families = "ready|starts_total|revocations_total|load_seconds_count"
        self.say(f"  $ curl -s {self.api_base}/metrics | grep -E '^genready_({families})'")
        code, text = _get_text(f"{self.api_base}/metrics")
        wanted = re.compile(rf"^genready_({families})\{{")
        for line in text.splitlines() if code == 200 else [f"(HTTP {code})"]:
            # Counters of reasons that never happened are noise here.
            if wanted.match(line) and not line.endswith(" 0.0"):
                self.say(f"    {line}")
        self.say(f"  units:  {self.um.unit_dir}/  (the shipped ones: units/ in the repository)")
        self.say(f"          {'  '.join(sorted(p.name for p in self.um.unit_dir.iterdir()))}")
        self.say(f"  config: {L.config}")
        self.say(f"  logs:   {L.logs}/{{sim,genready,bench}}.log")
        self.say("  On a real host: genready.service + /etc/genready/genready.toml; see README.md.\n")

    def cleanup(self) -> list[str]:
        """Stop everything this demo started and remove its files; what went wrong, if anything."""
        problems: list[str] = []
        if self.watch is not None:
            self.watch.close()
        if self.um.proc is not None and self.um.proc.poll() is None:
            # SIGKILL the simulator first: its SIGTERM linger would only make cleanup slower.
            for args in (("kill", "--signal=SIGKILL", SIM_UNIT),
                         ("stop", BENCH_PATH, BENCH_SERVICE, GENREADY_UNIT, SIM_UNIT)):
                try:
                    self.um.systemctl(*args, check=False, timeout=30)
                except subprocess.TimeoutExpired:
                    problems.append(f"systemctl --user {' '.join(args)} timed out")
        try:
            self.um.stop(timeout=30)
        except Exception as e:
            problems.append(f"stopping the private manager: {e}")
        if self.um.proc is not None and self.um.proc.poll() is None:
            problems.append(f"the private manager (pid {self.um.proc.pid}) is still running")
        if not self.keep:
            shutil.rmtree(self.layout.root, ignore_errors=True)
            if self.layout.root.exists():
                problems.append(f"could not remove {self.layout.root}")
        return problems

    # -- helpers ---------------------------------------------------------------------------------

    def _systemctl(self, *args: str, logs: tuple[str, ...], timeout: float = 60) -> None:
        try:
            r = self.um.systemctl(*args, check=False, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise DemoFailed(f"systemctl --user {' '.join(args)} did not return within {timeout:g} s",
                             logs=logs) from e
        if r.returncode != 0:
            raise DemoFailed(f"systemctl --user {' '.join(args)} failed ({r.returncode}): "
                             f"{(r.stderr or r.stdout).strip()}", logs=logs)

    def _systemctl_waiting(self, *args: str, timeout: float, logs: tuple[str, ...]) -> None:
        """A blocking systemctl call; on a terminal, a ticker shows what genready says meanwhile."""
        proc = subprocess.Popen(["systemctl", "--user", *args], env=self.um.env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        ticker = Ticker(self.s.enabled)
        t0 = time.monotonic()
        try:
            while proc.poll() is None:
                if time.monotonic() - t0 > timeout:
                    proc.kill()
                    raise DemoFailed(f"systemctl --user {' '.join(args)} did not return within {timeout:g} s",
                                     logs=logs)
                if ticker.enabled:
                    code, body = self._ready(timeout=1.0)
                    what = (f"genready: {body.get('state')} pid {body.get('pid')}"
                            if isinstance(body, dict) and code else "genready: starting")
                    ticker.show(f"{time.monotonic() - t0:5.1f} s  {what}")
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(0.2)
        finally:
            ticker.clear()
            if proc.poll() is None:
                proc.kill()
            output = proc.communicate()[0]
        if proc.returncode != 0:
            raise DemoFailed(f"systemctl --user {' '.join(args)} failed ({proc.returncode}): {output.strip()}",
                             logs=logs)

    def _ready(self, timeout: float = 5.0) -> tuple[int, Any]:
        try:
            return client.request(self.api_base, f"/ready/{TARGET}", timeout=timeout)
        except client.Unreachable as e:
            return 0, {"error": str(e)}

    def _waiting_for(self, tl: Timeline, gr_ready: float | None) -> str:
        if tl.new_pid is None:
            return f"waiting for the old process to finish (linger {self.st.linger_seconds:g} s)"
        if tl.new_can_generate is None:
            return f"new pid {tl.new_pid} is loading"
        if gr_ready is None:
            return "waiting for genready to verify the new pid"
        return "waiting for the benchmark"

    def _stuck_reason(self, tl: Timeline, gr_ready: float | None) -> str:
        return f"timed out after the restart while {self._waiting_for(tl, gr_ready)}"


class Ticker:
    """A transient status line on a terminal (overwritten in place); nothing otherwise."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._shown = False

    def show(self, text: str) -> None:
        if self.enabled:
            sys.stdout.write(f"\r\033[K\033[2m  … {text}\033[0m")
            sys.stdout.flush()
            self._shown = True

    def clear(self) -> None:
        if self._shown:
            sys.stdout.write("\r\033[K")
            sys.stdout.flush()
            self._shown = False


def _get_text(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return int(r.status), r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, ""
    except OSError as e:
        return 0, str(e)


@contextlib.contextmanager
def _signals_interrupt() -> Iterator[None]:
    """SIGTERM/SIGHUP end the demo like Ctrl-C does, so its cleanup still runs."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    saved = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def _ignore_signals() -> None:
    # Cleanup is time-bounded; a second Ctrl-C must not leave a systemd manager behind.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)


class _Story(Protocol):
    layout: Layout

    def cleanup(self) -> list[str]: ...


def run_checked(demo: _Story, style: Style, story: Callable[[], None]) -> tuple[int, list[str]]:
    """Run `story`, then always clean `demo` up: (exit status, cleanup problems).

    0: shown and checked; 1: failed (with the logs that explain it); 130: interrupted by
    Ctrl-C, SIGTERM or SIGHUP. Cleanup runs with those signals ignored.
    """
    rc = 0
    with _signals_interrupt():
        try:
            story()
        except DemoFailed as e:
            rc = 1
            print(f"\n{style.red('demo failed:')} {e}", file=sys.stderr, flush=True)
            for name in e.logs:
                path = demo.layout.log(name)
                print(f"--- last lines of {path}:\n{tail_text(path)}", file=sys.stderr)
        except KeyboardInterrupt:
            rc = 130
            print("\ndemo interrupted", file=sys.stderr, flush=True)
        except Exception as e:  # an unexpected bug: say what, still clean up
            rc = 1
            print(f"\n{style.red('demo failed:')} unexpected {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        finally:
            _ignore_signals()
            problems = demo.cleanup()
    for p in problems:
        print(f"cleanup: {p}", file=sys.stderr)
    return rc, problems


def run(*, fast: bool = False, keep: bool = False) -> int:
    """The whole demo; its exit status (0: shown and checked, 1: failed, 130: interrupted)."""
    style = Style(sys.stdout.isatty())
    reason = unavailable_reason()
    if reason:
        print(f"genready demo: cannot run here: {reason}", file=sys.stderr)
        print("hint: run it as root on a Linux machine with systemd installed (it need not be booted with "
              "systemd): sudo ./dev demo", file=sys.stderr)
        return 1
    demo = Demo(FAST if fast else FULL, keep=keep, style=style)

    def story() -> None:
        demo.intro()
        demo.boot()
        demo.install()
        old = demo.start_services()
        demo.start_path_unit()
        tl = demo.restart(old)
        demo.verdict(tl)
        demo.where_next()

    rc, problems = run_checked(demo, style, story)
    kept = f"kept {demo.layout.root}" if keep else f"removed {demo.layout.root} (--keep keeps it)"
    if problems:
        print(f"Cleanup INCOMPLETE (see above); {demo.layout.root} may remain.")
    else:
        print(f"Cleaned up: stopped the units and the private manager; {kept}.")
    total = time.monotonic() - demo.started
    print(f"demo {'finished' if rc == 0 else 'FAILED'} in {total:.1f} s")
    return rc if not problems else (rc or 1)


def main(args: argparse.Namespace) -> int:
    return run(fast=args.fast, keep=args.keep)
