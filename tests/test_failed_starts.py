"""Starts that fail before they are verified, seen by a real genready against a real systemd user
manager: a start that dies within milliseconds is recorded whole, and `genready restart` and
`wait --since` stop waiting within a second when systemd will not start the unit again."""

from __future__ import annotations

import io
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from genready.client import progress, waiting
from genready.compat import tomllib
from genready.rule.history import History
from genready.store.records import RecordStore
from genready.sweep import plan as sweepplan
from genready.sweep.run import steps
from genready.sweep.run.dropin import DropinLife
from genready.sweep.run.lines import Console, Timings
from genready.systemd.snapshot import Snapshot
from genready.timewords import iso
from genready_dev.harness import GENREADY, Genready, free_port, wait_for
from genready_dev.usermanager import UserManager
from tests.jsonserver import JsonServer

FAST = {"backoff_initial": 0.05, "backoff_max": 0.2, "probe_timeout": 2.0, "verify_owner": False}


def failing_unit(tmp: Path, name: str, ms: int, *, restart: str = "no") -> tuple[str, Path]:
    """A unit whose process says why it fails and exits 3 after `ms` milliseconds; its output file."""
    out = tmp / f"{name}.out"
    script = tmp / f"{name}.sh"
    pause = f"sleep {ms / 1000:.3f}\n" if ms else ""
    script.write_text(f"#!/bin/sh\necho 'config: /models/typo does not exist ({ms} ms)' >&2\n{pause}exit 3\n")
    script.chmod(0o755)
    return (f"[Unit]\nStartLimitIntervalSec=0\n[Service]\nExecStart={script}\nRestart={restart}\nRestartSec=0.2\n"
            f"StandardOutput=append:{out}\nStandardError=append:{out}\n"), out


@pytest.mark.parametrize("state, sub", [("failed", "failed"), ("inactive", "dead"), ("activating", "auto-restart")])
def test_a_start_first_seen_already_over_is_recorded_whole(tmp_path: Path, state: str, sub: str) -> None:
    """systemd's signals about a process that exited within milliseconds come as one: a new
    InvocationID, the unit down (or waiting to restart), MainPID 0. ExecMain* are that start's."""
    t = int(time.time() * 1e6) / 1e6
    over = Snapshot("t.service", load_state="loaded", active_state=state, sub_state=sub, invocation_id="b" * 32,
                    exec_main_pid=4242, exec_main_start_us=int(t * 1e6), exec_main_exit_us=int((t + 0.001) * 1e6),
                    inactive_enter_us=int((t + 0.002) * 1e6), exec_main_code=1, exec_main_status=3,
                    result="exit-code")
    with RecordStore(tmp_path) as store:
        h = History("t", "t.service", store)
        h.observe(Snapshot("t.service", load_state="loaded", active_state="inactive", sub_state="dead",
                           invocation_id="a" * 32))
        assert h.observe(over) is not None
        rec = h.get("b" * 32)
    assert rec is not None
    assert (rec.main_pid, rec.started_at, rec.result, rec.exit_code, rec.exit_status) == \
        (4242, iso(t), "exit-code", "exited", 3)
    assert rec.ended_at in (iso(t + 0.002), iso(t + 0.001))


def test_the_moment_a_start_shows_inactive_with_its_new_pid_is_not_its_end(tmp_path: Path) -> None:
    with RecordStore(tmp_path) as store:
        h = History("t", "t.service", store)
        h.observe(Snapshot("t.service", load_state="loaded", active_state="inactive", sub_state="dead", main_pid=77,
                           job_id=9, invocation_id="c" * 32, exec_main_pid=77))
        rec = h.get("c" * 32)
    assert rec is not None and rec.ended_at is None


@pytest.mark.parametrize("ms", [0, 1, 10, 100])
def test_a_start_that_dies_at_once_is_recorded_with_how_it_ended_and_its_lines(
        manager: UserManager, tmp_path: Path, ms: int) -> None:
    unit = f"fs-quick{ms}.service"
    text, _ = failing_unit(tmp_path, f"quick{ms}", ms)
    manager.install_unit(unit, text)
    g = Genready(manager, tmp_path, {"q": {"unit": unit, "url": f"http://127.0.0.1:{free_port()}", **FAST}})
    try:
        with g:
            manager.systemctl("start", unit, check=False)
            inv = wait_for(lambda: manager.show(unit, "InvocationID")["InvocationID"], 10, "an invocation")
            f = wait_for(lambda: (x := g.status()["targets"]["q"]["last_failure"]) and x["journal"] and x, 10,
                         "the failed start's lines in /status")
            assert f["invocation_id"] == inv
            assert (f["result"], f["exit_code"], f["exit_status"]) == ("exit-code", "exited", 3)
            assert f["ended_at"] and f["main_pid"]
            assert f["journal"] == [f"config: /models/typo does not exist ({ms} ms)"]
            rec = next(r for r in g.records("q") if r["invocation_id"] == inv)
            assert (rec["result"], rec["exit_status"], rec["main_pid"]) == ("exit-code", 3, f["main_pid"])
            assert rec["ended_at"] and rec["started_at"] <= rec["ended_at"]
            shown = subprocess.run([*GENREADY, "status", "--url", g.base], capture_output=True, text=True,
                                   timeout=30)
            assert "Result=exit-code (exited with status 3)" in shown.stdout, shown.stdout
            assert f"| config: /models/typo does not exist ({ms} ms)" in shown.stdout, shown.stdout
    finally:
        manager.remove_unit(unit)


def restart_cli(g: Genready, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    run = subprocess.run([*GENREADY, "restart", "q", "--config", str(g.config_path), *args],
                         capture_output=True, text=True, timeout=60, env=g.um.env)
    return run, time.monotonic() - t0


def ended_at(manager: UserManager, unit: str) -> float:
    """When the unit's last main process exited, on CLOCK_MONOTONIC (time.monotonic()'s clock)."""
    return int(manager.show(unit, "ExecMainExitTimestampMonotonic")["ExecMainExitTimestampMonotonic"]) / 1e6


def test_restart_of_a_failing_unit_exits_1_within_a_second_of_the_failure(
        manager: UserManager, tmp_path: Path) -> None:
    unit = "fs-restart.service"
    text, _ = failing_unit(tmp_path, "restart", 300)
    manager.install_unit(unit, text)
    g = Genready(manager, tmp_path, {"q": {"unit": unit, "url": f"http://127.0.0.1:{free_port()}", **FAST}})
    try:
        with g:
            run, took = restart_cli(g, "--timeout", "60")
            done = time.monotonic()
            assert run.returncode == 1, (run.returncode, run.stderr)
            assert done - ended_at(manager, unit) < 1.0, (done - ended_at(manager, unit), run.stderr)
            assert took < 30
            assert "Result=exit-code" in run.stderr and "status 3" in run.stderr, run.stderr
            assert "| config: /models/typo does not exist (300 ms)" in run.stderr, run.stderr
    finally:
        manager.remove_unit(unit)


def test_restart_waits_on_while_systemd_restarts_the_unit_itself(manager: UserManager, tmp_path: Path) -> None:
    """Restart=on-failure: each failed start is followed by one systemd makes itself; the client
    keeps waiting (its --timeout decides), and its answer names the failure."""
    unit = "fs-loop.service"
    text, _ = failing_unit(tmp_path, "loop", 10, restart="on-failure")
    manager.install_unit(unit, text)
    g = Genready(manager, tmp_path, {"q": {"unit": unit, "url": f"http://127.0.0.1:{free_port()}", **FAST}})
    try:
        with g:
            run, took = restart_cli(g, "--timeout", "3")
            assert run.returncode == 1, (run.returncode, run.stderr)
            assert took >= 3, took
            assert "Result=exit-code" in run.stderr, run.stderr
    finally:
        manager.systemctl("stop", unit, check=False)
        manager.remove_unit(unit)


def test_restart_of_a_crash_loop_ends_when_systemd_gives_up_with_the_last_start_s_own_line(
        manager: UserManager, tmp_path: Path) -> None:
    """Restart=on-failure until the start limit: systemd restarts the unit itself twice, then leaves it
    failed. restart exits 1 then, printing that last start's line only (each start says its own pid)."""
    unit = "fs-limit.service"
    out = tmp_path / "limit.out"
    manager.install_unit(unit, f"[Unit]\nStartLimitIntervalSec=60\nStartLimitBurst=3\n[Service]\n"
                               f"ExecStart=/bin/sh -c 'echo dies $$$$ >&2; exit 5'\nRestart=on-failure\n"
                               f"RestartSec=0.2\nStandardError=append:{out}\n")
    g = Genready(manager, tmp_path, {"q": {"unit": unit, "url": f"http://127.0.0.1:{free_port()}", **FAST}})
    try:
        with g:
            run, took = restart_cli(g, "--timeout", "60")
            assert run.returncode == 1 and took < 30, run.stderr
            said = out.read_text().splitlines()
            assert len(said) == 3, said
            assert f"| {said[-1]}" in run.stderr and f"| {said[0]}" not in run.stderr, run.stderr
            assert "Result=exit-code, exited with status 5" in run.stderr, run.stderr
    finally:
        manager.systemctl("reset-failed", unit, check=False)
        manager.remove_unit(unit)


def ready_503(g: Genready, since: float) -> dict[str, Any] | None:
    code, body = g.get(f"/ready/q?since={since:.6f}")
    f = body.get("start_failed") if code == 503 else None
    return body if f and f["journal"] and not f["restarting"] else None


def test_wait_since_exits_1_and_plain_wait_keeps_waiting(manager: UserManager, tmp_path: Path) -> None:
    unit = "fs-wait.service"
    text, _ = failing_unit(tmp_path, "wait", 0)
    manager.install_unit(unit, text)
    g = Genready(manager, tmp_path, {"q": {"unit": unit, "url": f"http://127.0.0.1:{free_port()}", **FAST}})
    try:
        with g:
            t0 = time.time()
            assert ready_503(g, t0) is None
            manager.systemctl("start", unit, check=False)
            body = wait_for(lambda: ready_503(g, t0), 10, "start_failed in /ready's 503")
            sf = body["start_failed"]
            assert (sf["result"], sf["exit_code"], sf["exit_status"], sf["restarting"]) == \
                ("exit-code", "exited", 3, False)
            assert sf["journal"] == ["config: /models/typo does not exist (0 ms)"]
            code, later = g.get(f"/ready/q?since={time.time():.6f}")
            assert code == 503 and later["start_failed"] is None  # not newer than since=: not said
            run = subprocess.run([*GENREADY, "wait", "q", "--url", g.base, "--since", f"{t0:.6f}", "--timeout", "60"],
                                 capture_output=True, text=True, timeout=60)
            assert run.returncode == 1, run.stderr
            assert "Result=exit-code" in run.stderr and "| config: /models/typo" in run.stderr, run.stderr
            # Plain wait: a new start may come; it waits out its timeout, and says what it saw.
            t1 = time.monotonic()
            run = subprocess.run([*GENREADY, "wait", "q", "--url", g.base, "--timeout", "1.5"],
                                 capture_output=True, text=True, timeout=60)
            took = time.monotonic() - t1
            assert run.returncode == 1 and took >= 1.5, run.stderr
            assert "Result=exit-code" in run.stderr, run.stderr
    finally:
        manager.remove_unit(unit)


# -- the client's wait, against a scripted /ready (in-process) -----------------------------------

class Scripted(JsonServer):
    """A /ready that answers 503 bodies from `answers` in turn (the last one for ever), at once."""

    def __init__(self, answers: list[dict[str, Any]]) -> None:
        self.answers: list[dict[str, Any]] = answers
        super().__init__(self._next)

    def _next(self, path: str) -> tuple[int, Any]:
        body = self.answers[min(len(self.asked) - 1, len(self.answers) - 1)]
        return (200 if body.get("ready") else 503), body


def body(restarting: bool | None) -> dict[str, Any]:
    failed = None if restarting is None else {
        "invocation_id": "ab" * 16, "main_pid": 7, "result": "exit-code", "exit_code": "exited", "exit_status": 3,
        "ended_at": "x", "journal": ["no such model"], "restarting": restarting}
    return {"ready": False, "target": "t", "state": "inactive", "reason": "t.service is failed", "start_failed": failed}


def test_a_wait_since_ends_at_a_failed_start_systemd_will_not_restart() -> None:
    s = Scripted([body(None), body(True), body(False)])
    try:
        t0 = time.monotonic()
        out = waiting.wait_ready(s.base, "t", 30, 1.0, on_failure=waiting.OnFailure.FINAL, poll=0.01,
                                 tick=lambda c, b: None)
        assert time.monotonic() - t0 < 5 and len(s.asked) == 3
        assert out.code == 503 and out.failed is not None and out.failed["restarting"] is False
        assert waiting.failure_lines(out.failed) == ["Result=exit-code, exited with status 3", "  | no such model"]
        assert "since=1.000000" in s.asked[0]
        # While systemd restarts the unit itself, FINAL waits on (its timeout decides); WAIT ignores failures.
        for mode, answers in ((waiting.OnFailure.FINAL, [body(True)]), (waiting.OnFailure.WAIT, [body(False)])):
            s.answers, s.asked = answers, []
            out = waiting.wait_ready(s.base, "t", 0.3, 1.0 if mode is waiting.OnFailure.FINAL else None,
                                     on_failure=mode, poll=0.01, tick=lambda c, b: None)
            assert out.code == 503 and len(s.asked) > 1
            assert out.failed is None if mode is waiting.OnFailure.WAIT else (out.failed or {})["restarting"]
    finally:
        s.close()


def test_a_sweep_wait_ends_at_any_failed_start_and_looks_once_more_to_say_which() -> None:
    """ANY (a sweep point): a crash loop ends the wait too; a failure still marked `restarting` is
    asked about once more, so a unit that merely had not settled is reported as down for good."""
    s = Scripted([body(True), body(False)])
    try:
        out = waiting.wait_ready(s.base, "t", 30, 1.0, on_failure=waiting.OnFailure.ANY, poll=0.01)
        assert len(s.asked) == 2 and out.failed is not None and out.failed["restarting"] is False
        s.answers, s.asked = [body(True)], []
        out = waiting.wait_ready(s.base, "t", 30, 1.0, on_failure=waiting.OnFailure.ANY, poll=0.01)
        assert len(s.asked) == 2 and out.failed is not None and out.failed["restarting"] is True
    finally:
        s.close()


def test_the_live_line_shows_a_failed_start() -> None:
    line = progress.target_line(body(False))
    assert "start abababababab failed: Result=exit-code exited 3" in line and "restarting" not in line
    assert progress.target_line(body(True)).endswith(", restarting")


class CountingUnit:
    """The sweep's systemd client, counting what the sweep asks of systemd."""

    def __init__(self) -> None:
        self.states = self.restarts = 0

    def state(self) -> Snapshot:
        self.states += 1
        return Snapshot("t.service")

    def restart(self, unit: str | None = None, *, reset_failed: bool = True) -> None:
        self.restarts += 1


@pytest.mark.parametrize("end", ["ready", "failed"])
def test_a_sweep_point_asks_systemd_nothing_while_it_waits(tmp_path: Path, end: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, each poll of a load read the unit over D-Bus (about 2,160 calls in a 6-minute load):
    now one read before the restart (where the unit's output stands), the restart, and the daemon."""
    loading = {"ready": False, "target": "t", "state": "loading", "reason": "waiting", "start_failed": None}
    last = ({"ready": True, "target": "t", "unit": "t.service", "pid": 42, "invocation_id": "cd" * 16,
             "load_seconds": 1.5} if end == "ready" else body(False))
    s = Scripted([*[loading] * 20, last])
    unit = CountingUnit()
    p = sweepplan.parse_plan(tomllib.loads('command = "x"\n[matrix]\na = [1]'), "plan.toml")
    opts = steps.SweepOptions(p, s.base, "t", "t.service", "user", 30, tmp_path)
    # The stand-in unit client counts what the step asks of systemd: the point of this test.
    life = DropinLife(unit, tmp_path / "dropin.conf")  # type: ignore[arg-type]
    ctx = steps.Ctx(opts, Console(io.StringIO(), 1), life, Timings(), steps.Signals(), None, 0.0)
    monkeypatch.setattr(steps, "POLL", 0.01)
    try:
        got = steps.start(ctx, p.points[0])
    finally:
        s.close()
    assert len(s.asked) >= 21 and unit.restarts == 1 and unit.states == 1
    if end == "ready":
        assert isinstance(got, steps.Verified) and (got.pid, got.load_seconds) == (42, 1.5)
    else:
        assert isinstance(got, steps.NotReady) and got.unit_result == "exit-code"
        assert "failed to start (Result=exit-code, exited with status 3)" in got.reason
        assert got.journal == ("no such model",)


class SlotsHeld(JsonServer):
    """A daemon whose long-poll slots are all held: every /ready?wait= is its "too many long-polls"
    503; a question without wait= is answered from `ready_after` questions on (not ready before)."""

    def __init__(self, ready_after: int) -> None:
        self.ready_after = ready_after
        super().__init__(self._next)

    def _next(self, path: str) -> tuple[int, Any]:
        if "wait=" in path:
            return 503, {"error": "too many long-polls in flight (limit 2); retry shortly, or ask without wait="}
        if len([p for p in self.asked if "wait=" not in p]) >= self.ready_after:
            return 200, {"ready": True, "target": "t", "pid": 7}
        return 503, body(None)


def test_a_wait_refused_a_long_poll_asks_without_wait_and_backs_off() -> None:
    """Issue 41 #10: the refusal is no answer. The client asks once without wait= (always answered)
    and pauses, longer each time, instead of asking again at once (37,558 requests in 20 s)."""
    s = SlotsHeld(ready_after=1)
    try:
        t0 = time.monotonic()
        out = waiting.wait_ready(s.base, "t", 30, None)
        assert out.code == 200 and time.monotonic() - t0 < 5 and len(s.asked) == 2, s.asked
        assert "wait=" in s.asked[0] and "wait=" not in s.asked[1]
    finally:
        s.close()
    s = SlotsHeld(ready_after=10**9)  # never ready: the whole timeout passes at a bounded rate
    try:
        t0 = time.monotonic()
        out = waiting.wait_ready(s.base, "t", 1.0, None)
        took = time.monotonic() - t0
        assert out.code == 503 and 0.95 <= took < 4
        assert len(s.asked) <= 2 * 4, f"{len(s.asked)} requests in {took:.1f} s"  # 0.25, 0.5, ... s apart
    finally:
        s.close()


def test_a_genready_from_before_since_monotonic_is_asked_with_since_alone() -> None:
    """`genready restart` sends since_monotonic= with since=; a daemon that does not know it answers
    400 naming it (its query check), and the client asks again with since= alone."""
    def answer(path: str) -> tuple[int, Any]:
        if "since_monotonic=" in path:
            return 400, {"error": "unknown query parameter(s): since_monotonic; known: wait, since, pid, invocation"}
        return 200, {"ready": True, "target": "t", "pid": 7}

    s = JsonServer(answer)
    try:
        out = waiting.wait_ready(s.base, "t", 10, time.time(), since_mono=time.monotonic())
        assert out.code == 200 and len(s.asked) == 2, s.asked
        assert "since_monotonic=" in s.asked[0] and "since=" in s.asked[1] and "since_monotonic" not in s.asked[1]
    finally:
        s.close()
