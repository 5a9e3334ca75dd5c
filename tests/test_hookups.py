"""systemd hookups, against a real user manager and simulator units.

- genready as a Type=notify unit: `systemctl start` blocks until the backend is verified, a
  unit with After=/Requires= on it starts after that; RELOADING=1 while a restarted backend
  is re-verified; the watchdog; SIGHUP with a broken config; SIGTERM.
- The path-triggered benchmark (the shipped genready-bench@ units, paths rewritten): one run
  per verified start, each with that start's PID, and a clean ExecCondition skip otherwise.
- The CLI for scripts: `guard`, `restart`, `wait` and their exit codes.

Units are named th-*; every test stops and removes its own. Conditions are waited for with
deadlines (helpers.wait_for), never with sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from genready.compat import UTC
from genready.exitcodes import Exit
from genready.systemd.snapshot import Snapshot
from genready.systemd.watcher import Watcher
from genready.timewords import from_iso
from genready_dev.harness import (
    GENREADY,
    Genready,
    code_paths,
    free_port,
    genready_service,
    show,
    sim_unit,
    wait_for,
)
from genready_dev.usermanager import UserManager
from tests.test_units import UNITS, genready_binary, rewrite

FAST = {"backoff_initial": 0.05, "backoff_max": 0.3, "probe_timeout": 2.0}


# --- helpers ---------------------------------------------------------------------------------

def install_sim(manager: UserManager, tmp: Path, unit: str, *flags: str, port: int | None = None) -> int:
    """Install (or rewrite, with daemon-reload) a simulator unit; its port."""
    port = port or free_port()
    manager.install_unit(unit, sim_unit(port, *flags, extra=f"StandardError=append:{tmp}/{unit}.log"))
    return port


def target(unit: str, port: int) -> dict[str, Any]:
    return {"unit": unit, "url": f"http://127.0.0.1:{port}", **FAST}


def genready_unit(g: Genready, extra: str = "") -> str:
    """genready serve as a Type=notify user unit, with the config the Genready helper wrote.
    Each time its process ends, a line `$SERVICE_RESULT $EXIT_CODE $EXIT_STATUS` goes to
    stops.log (an inactive unit is unloaded, and its Result with it)."""
    script = g.tmp / "stopped.sh"
    script.write_text(f'echo "$SERVICE_RESULT $EXIT_CODE $EXIT_STATUS" >> {g.tmp}/stops.log\n')
    return genready_service(g.config_path, g.log_path, f"TimeoutStartSec=60\nExecStopPost=/bin/sh {script}\n{extra}")


def stops(g: Genready) -> list[str]:
    path = g.tmp / "stops.log"
    return path.read_text().splitlines() if path.exists() else []


def unix_ts(manager: UserManager, unit: str, prop: str) -> float:
    """A timestamp property of `unit` as Unix time, to the microsecond."""
    out = manager.systemctl("show", unit, f"-p{prop}", "--timestamp=us+utc").stdout.strip()
    value = out.split("=", 1)[1]
    assert value, f"{unit} has no {prop}"
    return datetime.strptime(value, "%a %Y-%m-%d %H:%M:%S.%f UTC").replace(tzinfo=UTC).timestamp()


def record_of(g: Genready, pid: int, name: str = "t") -> dict[str, Any]:
    return next(r for r in g.records(name) if r["main_pid"] == pid)



def new_main_pid(manager: UserManager, unit: str, old: int) -> int:
    return wait_for(lambda: (pid := show(manager, unit)[0]) not in (0, old) and pid, 20, f"a new MainPID of {unit}")


def active_state(manager: UserManager, unit: str) -> str:
    return manager.show(unit, "ActiveState")["ActiveState"]


def cli(manager: UserManager, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The genready CLI, with the test manager's bus in its environment (for `restart`)."""
    return subprocess.run([*GENREADY, *args], env=manager.env, capture_output=True, text=True, timeout=timeout)


def remove_units(manager: UserManager, *units: str) -> None:
    for u in units:
        manager.systemctl("stop", u, check=False)
        manager.systemctl("reset-failed", u, check=False)
        manager.remove_unit(u)


class StateRecorder(threading.Thread):
    """Records every distinct ActiveState of a unit from systemd's own D-Bus signals.

    genready's Watcher, on its own loop in this thread. Polling systemctl missed a 40 ms
    `deactivating` on a loaded CI machine; systemd flushes its D-Bus queue between two
    events, so each state it passes through arrives as its own PropertiesChanged.
    """

    def __init__(self, unit: str) -> None:
        super().__init__(daemon=True)
        self.unit = unit
        self.seen: list[str] = []
        self._subscribed = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._halt: asyncio.Event | None = None

    def run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop, self._halt = asyncio.get_running_loop(), asyncio.Event()
        watcher = Watcher("user", [self.unit], self._on_change)
        task = asyncio.create_task(watcher.run())
        try:
            await self._halt.wait()
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _on_change(self, unit: str, snap: Snapshot | None) -> None:
        if snap is None:
            return
        if not self.seen or self.seen[-1] != snap.active_state:
            self.seen.append(snap.active_state)
        self._subscribed.set()

    def start_recording(self) -> None:
        """Start, and return once the first full read arrived (signals from then on are caught)."""
        self.start()
        assert self._subscribed.wait(10), f"no D-Bus snapshot of {self.unit} within 10 s"

    def stop(self, until: str) -> list[str]:
        """Wait (up to 5 s) for the state `until` to be signalled, then stop; the states seen."""
        wait_for(lambda: until in self.seen, 5, f"{self.unit} signalled {until}")
        assert self._loop is not None and self._halt is not None
        self._loop.call_soon_threadsafe(self._halt.set)
        self.join(10)
        return self.seen


# --- 1. ordering: Type=notify gated on a verified backend ------------------------------------

def test_start_returns_only_after_the_backend_is_verified_and_orders_dependents(
        manager: UserManager, tmp_path: Path) -> None:
    sim, gr, dep = "th-order-sim.service", "th-order-genready.service", "th-order-after.service"
    port = install_sim(manager, tmp_path, sim, "--load-seconds", "3")
    g = Genready(manager, tmp_path, {"t": target(sim, port)})
    manager.install_unit(gr, genready_unit(g))
    # The dependent unit records when it ran and what `genready wait --timeout 0` said then.
    out = tmp_path / "after.out"
    script = tmp_path / "after.sh"
    wait_cmd = shlex.join([*GENREADY, "wait", "t", "--url", g.base, "--timeout", "0"])
    script.write_text(f"date +%s.%N >> {out}\n{wait_cmd} >> {out} 2>&1\necho rc=$? >> {out}\n")
    manager.install_unit(dep, f"[Unit]\nRequires={gr}\nAfter={gr}\n\n[Service]\nType=oneshot\n"
                              f"RemainAfterExit=yes\nExecStart=/bin/sh {script}\n")  # kept loaded, to be shown
    try:
        manager.systemctl("start", sim)
        # Queued before genready is even asked for: only After= keeps it waiting.
        manager.systemctl("start", "--no-block", dep)
        t_call = time.time()
        manager.systemctl("start", gr, timeout=60)
        t_ret = time.time()
        code, body = g.get("/ready/t")
        pid = show(manager, sim)[0]
        assert code == 200 and body["pid"] == pid, body

        sim_start = unix_ts(manager, sim, "ExecMainStartTimestamp")
        ready_at = from_iso(record_of(g, pid)["ready_at"])
        gr_active = unix_ts(manager, gr, "ActiveEnterTimestamp")
        assert ready_at is not None
        print(f"\nsystemctl start {gr} blocked {t_ret - t_call:.2f}s; returned {t_ret - sim_start:.2f}s "
              f"after the simulator started, {t_ret - ready_at:.3f}s after it was verified")
        assert t_ret - sim_start >= 3.0
        assert sim_start + 3.0 <= ready_at <= gr_active <= t_ret

        wait_for(lambda: "rc=" in (out.read_text() if out.exists() else ""), 20, f"{dep} to run")
        ran_at, said, rc = out.read_text().splitlines()
        dep_start = unix_ts(manager, dep, "ExecMainStartTimestamp")
        print(f"{dep} started {dep_start - ready_at:.3f}s after the verification")
        assert ready_at <= gr_active <= dep_start <= float(ran_at)
        assert said.startswith(f"t: ready pid {pid} "), said
        assert rc == "rc=0"
        assert manager.show(dep, "Result")["Result"] == "success"
    finally:
        remove_units(manager, dep, gr, sim)


# --- 2. the path-triggered benchmark -----------------------------------------------------------

class Bench:
    """th-bench@t.path/.service: the shipped genready-bench@ units with paths rewritten, the real
    genready CLI pointed at the test daemon, and a benchmark that logs $GENREADY_PID and the time."""

    def __init__(self, manager: UserManager, tmp: Path, g: Genready, prefix: str = "th-bench") -> None:
        self.manager = manager
        self.log = tmp / "bench.log"
        exe = genready_binary()
        mapping = {
            # the CLI, told where this test's daemon listens
            "/usr/bin/genready wait %i": f"{exe} wait %i --url {g.base}",
            "/usr/bin/genready guard %i": f"{exe} guard %i --url {g.base}",
            # paths of a system install → the tmp dir
            "/run/genready/": f"{g.runtime_dir}/",
            "/etc/genready/": f"{tmp}/",
            # unit names unique to this test; genready runs as a plain process (Wants= tolerates that)
            "genready-bench@": f"{prefix}@",
            "genready.service": f"{prefix}-genready-absent.service",
        }
        svc = rewrite((UNITS / "genready-bench@.service").read_text(), mapping)
        # The log is under /tmp, which the unit's PrivateTmp= would hide.
        # The venv and the code may be there too, wherever the checkout is.
        code = " ".join(str(p) for p in code_paths())
        svc = svc.replace("[Service]\n", f"[Service]\nBindPaths={tmp}\nBindReadOnlyPaths={code}\n"
                          f"StandardOutput=append:{tmp}/bench.out\nStandardError=append:{tmp}/bench.out\n", 1)
        (tmp / "bench-t.env").write_text(
            f"GENREADY_BENCH_COMMAND=sh -c 'echo $GENREADY_PID $(date +%s.%N) >> {self.log}'\n")
        manager.install_unit(f"{prefix}@.service", svc)
        manager.install_unit(f"{prefix}@.path", rewrite((UNITS / "genready-bench@.path").read_text(), mapping))
        self.templates = (f"{prefix}@.path", f"{prefix}@.service")
        self.path_unit, self.service = f"{prefix}@t.path", f"{prefix}@t.service"

    def runs(self) -> list[tuple[int, float]]:
        text = self.log.read_text() if self.log.exists() else ""
        return [(int(p), float(t)) for p, t in (line.split() for line in text.splitlines())]

    def result(self) -> dict[str, str]:
        return self.manager.show(self.service, "ActiveState", "Result")

    def wait_runs(self, n: int) -> None:
        wait_for(lambda: len(self.runs()) >= n and self.result()["ActiveState"] == "inactive", 20,
                 f"{n} benchmark runs, then the service inactive")
        assert len(self.runs()) == n, self.runs()
        assert self.result()["Result"] == "success"  # guard saw the same instance throughout

    def remove(self) -> None:
        remove_units(self.manager, self.path_unit, self.service)
        for name in self.templates:
            self.manager.remove_unit(name)


@pytest.mark.usefixtures("inaccessible_nodes")  # the shipped bench unit's ProtectHome= etc. need them
def test_bench_runs_once_per_verified_start_with_its_pid(manager: UserManager, tmp_path: Path) -> None:
    sim = "th-bench-sim.service"
    # Each restart removes the stamp (a start that ExecCondition skips), then writes it anew (a
    # run). 1 s of loading keeps the two apart: the skip is seen as Result=exec-condition, and
    # the stamp is not written while the skipped start is still finishing (a PathChanged event
    # then merges into that start, and the run would be lost).
    port = install_sim(manager, tmp_path, sim, "--load-seconds", "1")
    g = Genready(manager, tmp_path, {"t": target(sim, port)})
    g.runtime_dir.mkdir()
    bench = Bench(manager, tmp_path, g)
    try:
        # The path unit watches before the first start, so that start counts: 1 + 5 runs.
        manager.systemctl("start", bench.path_unit, timeout=30)
        manager.systemctl("start", sim)
        g.start()
        bench.wait_runs(1)
        pids = [show(manager, sim)[0]]
        for i in range(1, 6):
            if i in (2, 3):
                # Start 2 lingers 1.5 s after SIGTERM, answering generations while
                # deactivating: restart 3 stops it. daemon-reload must not disturb readiness.
                flags = ("--load-seconds", "1", *(("--linger-seconds", "1.5") if i == 2 else ()))
                install_sim(manager, tmp_path, sim, *flags, port=port)
            t0 = time.monotonic()
            manager.systemctl("restart", sim)
            stop_took = time.monotonic() - t0
            new = new_main_pid(manager, sim, pids[-1])
            # The stamp's removal at the restart started the service, and ExecCondition skipped it.
            wait_for(lambda: bench.result() == {"ActiveState": "inactive", "Result": "exec-condition"}, 20,
                     f"restart {i}: the skipped start")
            assert len(bench.runs()) == i
            bench.wait_runs(i + 1)
            pids.append(new)
            print(f"\nrestart {i}: systemctl restart took {stop_took:.2f}s; run {i + 1} logged pid {new}")

        runs = bench.runs()
        assert [p for p, _ in runs] == pids and len(set(pids)) == 6
        # Never while not ready: each run lies inside its start's verified window, as recorded.
        for pid, at in runs:
            rec = record_of(g, pid)
            ready_at, revoked_at = from_iso(rec["ready_at"]), from_iso(rec["revoked_at"])
            assert ready_at is not None and ready_at <= at, rec
            assert revoked_at is None or at <= revoked_at, rec

        # Not ready at all: the stamp's removal triggers a start that is skipped, not failed.
        manager.systemctl("stop", sim)
        wait_for(lambda: bench.result() == {"ActiveState": "inactive", "Result": "exec-condition"}, 20,
                 "the skipped start after the stop")
        assert not (g.runtime_dir / "t.ready").exists()
        assert manager.show(bench.path_unit, "ActiveState", "SubState") == {"ActiveState": "active",
                                                                            "SubState": "waiting"}
        assert len(bench.runs()) == 6
    finally:
        g.stop()
        bench.remove()
        remove_units(manager, sim)


# --- 3. guard ------------------------------------------------------------------------------

def test_guard(manager: UserManager, tmp_path: Path) -> None:
    sim = "th-guard-sim.service"
    port = install_sim(manager, tmp_path, sim, "--load-seconds", "0.5")
    manager.systemctl("start", sim)
    g = Genready(manager, tmp_path, {"t": target(sim, port)}).start()
    guard = [*GENREADY, "guard", "t", "--url", g.base, "--"]
    try:
        pid, inv = show(manager, sim)
        wait_for(lambda: g.ready_pid("t") == pid, 20, "verified")

        # A quiet run: CMD's exit status passes through; the pinned instance is in its env.
        env_out = tmp_path / "env.out"
        p = subprocess.run([*guard, "sh", "-c", f"env > {env_out}; exit 3"], capture_output=True, text=True,
                           timeout=30)
        assert p.returncode == 3, p.stderr
        env = dict(line.split("=", 1) for line in env_out.read_text().splitlines() if "=" in line)
        assert env["GENREADY_PID"] == str(pid)
        assert env["GENREADY_INVOCATION_ID"] == inv
        assert env["GENREADY_UNIT"] == sim

        # A restart while CMD runs: 75 even though CMD exits 0.
        started, go = tmp_path / "started", tmp_path / "go"
        cmd = f"touch {started}; while [ ! -e {go} ]; do sleep 0.02; done; exit 0"
        run = subprocess.Popen([*guard, "sh", "-c", cmd], stderr=subprocess.PIPE, text=True)
        try:
            wait_for(started.exists, 20, "the guarded command started")
            manager.systemctl("restart", sim)
            new = new_main_pid(manager, sim, pid)
            wait_for(lambda: g.ready_pid("t") == new, 20, "the new start verified")
        finally:
            go.touch()
            _, err = run.communicate(timeout=30)
        assert run.returncode == 75, err
        assert f"pid {pid}" in err and "not trustworthy" in err, err

        # Not ready: 75 and CMD never runs.
        manager.systemctl("stop", sim)
        wait_for(lambda: g.get("/ready/t")[0] == 503, 20, "not ready after the stop")
        ran = tmp_path / "ran"
        p = subprocess.run([*guard, "touch", str(ran)], capture_output=True, text=True, timeout=30)
        assert p.returncode == 75, p.stderr
        assert "not ready" in p.stderr and not ran.exists()
    finally:
        g.stop()
        remove_units(manager, sim)


# --- 4. restart and wait -----------------------------------------------------------------------

def test_restart_and_wait_exit_codes(manager: UserManager, tmp_path: Path) -> None:
    sim = "th-restart-sim.service"
    port = install_sim(manager, tmp_path, sim, "--load-seconds", "1")
    manager.systemctl("start", sim)
    g = Genready(manager, tmp_path, {"t": target(sim, port)}).start()
    cfg = str(g.config_path)
    try:
        old, _ = show(manager, sim)
        wait_for(lambda: g.ready_pid("t") == old, 20, "verified")

        # restart returns once a start newer than the restart is verified, and names it.
        t0 = time.time()
        p = cli(manager, "restart", "t", "--config", cfg, "--timeout", "30")
        t_ret = time.time()
        assert p.returncode == 0, p.stderr
        pid, inv = show(manager, sim)
        assert pid != old
        assert p.stdout.startswith(f"t: ready pid {pid} invocation {inv} "), p.stdout
        ready_at = from_iso(record_of(g, pid)["ready_at"])
        assert ready_at is not None
        start = unix_ts(manager, sim, "ExecMainStartTimestamp")
        print(f"\ngenready restart took {t_ret - t0:.2f}s; returned {t_ret - ready_at:.3f}s after the "
              f"verification of pid {pid}")
        assert t0 < start and start + 1.0 <= ready_at <= t_ret
        assert g.ready_pid("t") == pid

        # wait: 0 ready (printing the pid), 1 timeout, 69 unreachable, 2 usage, 64 a bad number.
        p = cli(manager, "wait", "--config", cfg, "--timeout", "0")  # the only target by default
        assert p.returncode == 0 and f"ready pid {pid} invocation {inv}" in p.stdout, p
        t1 = time.monotonic()
        p = cli(manager, "wait", "t", "--url", g.base, "--timeout", "0.5", "--since", str(time.time()))
        assert p.returncode == 1 and time.monotonic() - t1 >= 0.5, p
        p = cli(manager, "wait", "t", "--url", f"http://127.0.0.1:{free_port()}", "--timeout", "0")
        assert p.returncode == 69 and "unreachable" in p.stderr, p
        p = cli(manager, "wait", "nope", "--url", g.base, "--timeout", "0")
        assert p.returncode == Exit.USAGE and "nope" in p.stderr, p
        p = cli(manager, "wait", "t", "--url", g.base, "--timeout", "soon")
        assert p.returncode == Exit.BAD_ARGUMENT, p
        p = cli(manager, "restart", "nope", "--config", cfg)
        assert p.returncode == Exit.USAGE, p
        assert show(manager, sim)[0] == pid  # a refused restart restarted nothing
    finally:
        g.stop()
        remove_units(manager, sim)


# The genready CLI with its wall clock 30 s ahead of the host's: what a clock stepped back by 30 s
# during the restart looks like to it (since= taken before the step is 30 s after the new start).
AHEAD = ("import sys, time\n_wall = time.time\ntime.time = lambda: _wall() + 30\n"
         "from genready.cli import main\nsys.exit(main(sys.argv[1:]))")


def test_restart_finds_the_new_start_across_a_wall_clock_step(manager: UserManager, tmp_path: Path) -> None:
    sim = "th-step-sim.service"
    port = install_sim(manager, tmp_path, sim, "--load-seconds", "0.5")
    manager.systemctl("start", sim)
    g = Genready(manager, tmp_path, {"t": target(sim, port)}).start()
    try:
        old, _ = show(manager, sim)
        wait_for(lambda: g.ready_pid("t") == old, 20, "verified")
        t0 = time.monotonic()
        p = subprocess.run([sys.executable, "-c", AHEAD, "restart", "t", "--config", str(g.config_path),
                            "--timeout", "20"], env=manager.env, capture_output=True, text=True, timeout=60)
        took = time.monotonic() - t0
        pid, inv = show(manager, sim)
        print(f"\ngenready restart with its clock 30 s ahead took {took:.2f}s, exit {p.returncode}")
        assert p.returncode == 0 and pid != old, p.stderr
        assert p.stdout.startswith(f"t: ready pid {pid} invocation {inv} "), p.stdout
        assert took < 15, took
        # /ready?since= alone compares wall clocks: the client's since= is after the new start.
        assert g.get(f"/ready/t?since={time.time() + 30:.6f}")[0] == 503
    finally:
        g.stop()
        remove_units(manager, sim)


# --- 5. RELOADING, SIGHUP, SIGTERM; the watchdog ------------------------------------------

def test_reloading_sighup_and_sigterm(manager: UserManager, tmp_path: Path) -> None:
    sim, gr = "th-reload-sim.service", "th-reload-genready.service"
    port = install_sim(manager, tmp_path, sim, "--load-seconds", "2")
    g = Genready(manager, tmp_path, {"t": target(sim, port)})
    manager.install_unit(gr, genready_unit(g))
    try:
        manager.systemctl("start", sim)
        manager.systemctl("start", gr, timeout=60)
        gpid = show(manager, gr)[0]
        old = show(manager, sim)[0]
        assert g.ready_pid("t") == old
        assert manager.show(gr, "StatusText")["StatusText"].startswith(f"t: ready pid {old} ")

        # RELOADING=1 while the restarted backend loads and is re-verified, then READY=1.
        t0 = time.monotonic()
        manager.systemctl("restart", "--no-block", sim)
        wait_for(lambda: active_state(manager, gr) == "reloading", 10, f"{gr} reloading")
        t_reloading = time.monotonic()
        new = new_main_pid(manager, sim, old)
        assert g.ready_pid("t") is None
        status = manager.show(gr, "StatusText")["StatusText"]
        assert status.startswith("t: ") and "ready" not in status, status
        wait_for(lambda: active_state(manager, gr) == "active", 20, f"{gr} active again")
        t_active = time.monotonic()
        assert g.ready_pid("t") == new
        assert show(manager, gr)[0] == gpid  # the same genready throughout: a reload, not a restart
        print(f"\n{gr}: reloading {t_reloading - t0:.3f}s after the restart request, for "
              f"{t_active - t_reloading:.2f}s (the backend loads for 2 s)")
        assert t_active - t0 >= 2.0

        # SIGHUP with a broken config: refused, the running one kept.
        good = g.config_path.read_text()
        g.config_path.write_text(good + 'colour = "blue"\n')  # lands in the last table, [targets.t]
        manager.systemctl("reload", gr)
        st = wait_for(lambda: (s := g.status())["config_error"] and s, 10, "config_error in /status")
        assert "targets.t.colour" in st["config_error"], st["config_error"]
        assert show(manager, gr)[0] == gpid and active_state(manager, gr) == "active"
        assert g.ready_pid("t") == new
        status = manager.show(gr, "StatusText")["StatusText"]
        assert "config reload refused" in status and "targets.t.colour" in status, status
        # Fixed: the next SIGHUP clears the error.
        g.config_path.write_text(good)
        manager.systemctl("reload", gr)
        wait_for(lambda: g.status()["config_error"] is None, 10, "config_error cleared")
        assert "refused" not in manager.show(gr, "StatusText")["StatusText"]

        # SIGTERM (from outside systemd, so `deactivating` can only come from STOPPING=1),
        # with a long-poll in flight (what every `genready wait` does): a clean exit within 5 s.
        long_poll = http.client.HTTPConnection("127.0.0.1", g.port, timeout=30)
        long_poll.request("GET", f"/ready/t?since={time.time()}&wait=60")
        assert g.get("/status")[0] == 200  # answered after the long-poll's request was read
        states = StateRecorder(gr)
        states.start_recording()
        try:
            t0 = time.monotonic()
            os.kill(gpid, signal.SIGTERM)
            wait_for(lambda: active_state(manager, gr) == "inactive", 5, f"{gr} inactive after SIGTERM")
            took = time.monotonic() - t0
        finally:
            seen = states.stop(until="inactive")
        answer: int | str
        try:
            answer = long_poll.getresponse().status
        except (http.client.HTTPException, OSError) as e:
            answer = repr(e)
        print(f"SIGTERM: inactive after {took:.2f}s; states seen {seen}; the long-poll got {answer}")
        assert "deactivating" in seen, seen
        assert answer != 200
        assert stops(g) == ["success exited 0"]
    finally:
        remove_units(manager, gr, sim)


def test_watchdog_kills_and_restarts_a_stopped_genready(manager: UserManager, tmp_path: Path) -> None:
    sim, gr = "th-wd-sim.service", "th-wd-genready.service"
    port = install_sim(manager, tmp_path, sim)
    g = Genready(manager, tmp_path, {"t": target(sim, port)})
    manager.install_unit(gr, genready_unit(g, "WatchdogSec=2\nRestart=on-failure\nRestartSec=0.1\n"))
    gpid = 0
    try:
        manager.systemctl("start", sim)
        manager.systemctl("start", gr, timeout=60)
        gpid = show(manager, gr)[0]
        # The pings arrive (every WATCHDOG_USEC/2 = 1 s), so the watchdog has not fired so far.
        first = manager.show(gr, "WatchdogTimestampMonotonic")["WatchdogTimestampMonotonic"]
        wait_for(lambda: manager.show(gr, "WatchdogTimestampMonotonic")["WatchdogTimestampMonotonic"] != first,
                 5, "a watchdog ping")

        t0 = time.monotonic()
        os.kill(gpid, signal.SIGSTOP)  # a wedged event loop, as far as systemd can tell
        new = new_main_pid(manager, gr, gpid)
        t_new = time.monotonic()
        wait_for(lambda: active_state(manager, gr) == "active", 20, f"{gr} active again")
        t_active = time.monotonic()
        print(f"\nwatchdog: SIGSTOP → new MainPID after {t_new - t0:.2f}s, active (backend re-verified) "
              f"after {t_active - t0:.2f}s")
        assert 1.0 <= t_new - t0 <= 6.0
        assert manager.show(gr, "NRestarts")["NRestarts"] == "1"
        # SIGABRT, systemd's default WatchdogSignal= ("dumped" where core dumps are enabled).
        assert stops(g) in (["watchdog killed ABRT"], ["watchdog dumped ABRT"]), stops(g)
        assert g.ready_pid("t") == show(manager, sim)[0]
        assert new != gpid
        with pytest.raises(ProcessLookupError):
            os.kill(gpid, 0)
    finally:
        if gpid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(gpid, signal.SIGCONT)
        remove_units(manager, gr, sim)
