"""The CLI against careless use: guard ends all of CMD, bad numbers are refused at once, closed
output pipes do not change the exit status, `wait` holds across a daemon restart.

In-process where the logic allows (argument checks, the console's writes, `wait` against an
unreachable daemon); the process group with real processes (marked system); what needs a
verified target against the private systemd manager.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from genready import cli, console
from genready.client.guard import ProcessGroup, exit_status, group_members
from genready.exitcodes import Exit
from genready_dev.harness import GENREADY, Genready, alive, free_port, show, sim_unit, wait_for
from genready_dev.hostile import metric
from genready_dev.usermanager import UserManager

FAST = {"backoff_initial": 0.05, "backoff_max": 0.3, "probe_timeout": 2.0}


OUTPUTS = ("closed", "full", "broken")


def exit_status_with(args: list[str], fd: int, how: str, timeout: float = 60) -> tuple[int, str]:
    """Run the CLI with its stdout (`fd` 1) or stderr (2) closed, on /dev/full, or a pipe whose
    reader is gone; (its exit status, the other stream's text)."""
    argv = [*GENREADY, *args]
    other = subprocess.PIPE
    if how == "closed":
        argv = ["sh", "-c", f'exec "$@" {fd}>&-', "sh", *argv]
        out: Any = None
    elif how == "full":
        out = open("/dev/full", "wb")  # noqa: SIM115  # closed below
    else:
        r, w = os.pipe()
        os.close(r)  # nobody reads: every write fails with EPIPE
        out = w
    kw = {"stdout": out, "stderr": other} if fd == 1 else {"stdout": other, "stderr": out}
    try:
        p = subprocess.run(argv, timeout=timeout, check=False, text=True, **kw)
    finally:
        if hasattr(out, "close"):
            out.close()
        elif isinstance(out, int):
            os.close(out)
    return p.returncode, (p.stderr if fd == 1 else p.stdout) or ""


# -- in-process: the process group ---------------------------------------------------------------

def test_a_killed_command_is_128_plus_the_signal() -> None:
    assert exit_status(-signal.SIGKILL) == 137
    assert exit_status(-signal.SIGHUP) == 129
    assert exit_status(3) == 3


@pytest.mark.system
def test_a_daemon_the_command_forked_is_ended_with_it(tmp_path: Path) -> None:
    pidfile = tmp_path / "daemon.pid"
    child = subprocess.Popen(["sh", "-c", f"sleep 300 & echo $! > {pidfile}; exit 0"], start_new_session=True)
    group = ProcessGroup(child, grace=5)
    assert group.wait() == 0
    forked = int(pidfile.read_text())
    assert group.left_behind == 1
    wait_for(lambda: not alive(forked), 10, "the forked daemon ended")
    assert group_members(child.pid) == []


@pytest.mark.system
def test_a_command_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    started = tmp_path / "started"
    child = subprocess.Popen(["sh", "-c", f"trap '' TERM; touch {started}; while :; do sleep 0.05; done"],
                             start_new_session=True)
    group = ProcessGroup(child, grace=0.5)
    wait_for(started.exists, 10, "the command started")
    t0 = time.monotonic()
    group.stop(signal.SIGTERM)
    rc = group.wait()
    took = time.monotonic() - t0
    assert exit_status(rc) == 128 + signal.SIGKILL
    assert 0.5 <= took < 5, took


# -- in-process: bad numbers are usage errors (64), at once ------------------------------------

@pytest.mark.parametrize("args", [
    ["wait", "t", "--url", "http://127.0.0.1:1", "--timeout", "nan"],
    ["wait", "t", "--url", "http://127.0.0.1:1", "--timeout", "inf"],
    ["wait", "t", "--url", "http://127.0.0.1:1", "--timeout", "-1"],
    ["wait", "t", "--url", "http://127.0.0.1:1", "--timeout", "soon"],
    ["wait", "t", "--url", "http://127.0.0.1:1", "--since", "nan"],
    ["restart", "t", "--timeout", "nan"],
    ["sweep", "restore", "t", "--timeout", "nan"],
    ["sweep", "restore", "t", "--timeout", "-5"],
    ["guard", "t", "--url", "http://127.0.0.1:1", "--interval", "0", "--", "true"],
    ["guard", "t", "--url", "http://127.0.0.1:1", "--interval", "-1", "--", "true"],
    ["guard", "t", "--url", "http://127.0.0.1:1", "--interval", "nan", "--", "true"],
    ["guard", "t", "--url", "http://127.0.0.1:1", "--kill-after", "inf", "--", "true"],
])
def test_bad_numbers_exit_64_at_once_naming_the_flag(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(args)
    err = capsys.readouterr().err
    assert e.value.code == Exit.BAD_ARGUMENT, err
    flag = next(a for a in args if a.startswith("--") and a not in ("--url", "--"))
    assert f"{flag}: expected a finite number" in err, err


@pytest.mark.parametrize(("flag", "text", "value"), [("timeout", "0", 0.0), ("timeout", "1e3", 1000.0),
                                                     ("interval", "0.01", 0.01), ("since", "1700000000.5",
                                                                                  1700000000.5)])
def test_good_numbers_are_floats(flag: str, text: str, value: float) -> None:
    import argparse

    args = argparse.Namespace(**{flag: text})
    cli.check_numbers(args)
    assert getattr(args, flag) == value


# -- in-process: closed or full output never changes an exit status ---------------------------

def test_a_write_to_a_pipe_nobody_reads_is_dropped_and_the_next_ones_too() -> None:
    r, w = os.pipe()
    os.close(r)
    with os.fdopen(w, "w") as stream:
        console.write("lost\n", stream)  # EPIPE: swallowed, and the fd now leads to /dev/null
        assert os.path.samestat(os.fstat(w), os.stat(os.devnull))
        console.write("also lost\n", stream)
    assert stream.closed  # closing flushed without raising: the interpreter's final flush would not fail either


def test_a_write_to_a_full_device_or_a_closed_stream_is_dropped() -> None:
    with open("/dev/full", "w") as full:
        console.write("x" * 10000, full)  # ENOSPC: swallowed, the fd now leads to /dev/null
        assert os.path.samestat(os.fstat(full.fileno()), os.stat(os.devnull))
        console.write("more", full)
    assert full.closed  # the close's flush did not raise either
    closed = open(os.devnull, "w")  # noqa: SIM115
    closed.close()
    console.write("x", closed)  # ValueError (I/O on a closed file): swallowed, nothing to silence
    console.write("x", None)  # the fd was closed when Python started


@pytest.mark.system
@pytest.mark.parametrize("how", OUTPUTS)
def test_an_unreachable_daemon_is_69_whoever_reads_stderr(how: str) -> None:
    rc, out = exit_status_with(["wait", "t", "--url", f"http://127.0.0.1:{free_port()}", "--timeout", "0"], 2, how)
    assert rc == Exit.UNAVAILABLE, out


@pytest.mark.system
@pytest.mark.parametrize("how", OUTPUTS)
def test_check_config_is_0_whoever_reads_stdout(tmp_path: Path, how: str) -> None:
    cfg = tmp_path / "g.toml"
    cfg.write_text('[targets.t]\nunit = "t.service"\nurl = "http://127.0.0.1:30000"\n')
    rc, err = exit_status_with(["check-config", "--config", str(cfg)], 1, how)
    assert rc == 0 and "Traceback" not in err, err


@pytest.mark.system
@pytest.mark.parametrize("how", OUTPUTS)
@pytest.mark.parametrize(("args", "status"), [(["wait", "--timeout", "nan"], Exit.BAD_ARGUMENT),
                                              (["no-such-command"], Exit.USAGE)])
def test_a_usage_error_is_its_status_whoever_reads_stderr(how: str, args: list[str], status: Exit) -> None:
    rc, _ = exit_status_with(args, 2, how)
    assert rc == status


# -- in-process: wait waits for the daemon too -------------------------------------------------

def test_wait_waits_for_an_unreachable_daemon_until_its_timeout(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with pytest.raises(SystemExit) as e:
        cli.main(["wait", "t", "--url", url, "--timeout", "1.5"])
    took = time.monotonic() - t0
    err = capsys.readouterr().err
    assert e.value.code == Exit.UNAVAILABLE, err
    assert err.count("waiting for the daemon") == 1, err  # said once, not per attempt
    assert took >= 1.5, took
    # --timeout 0 (ExecCondition=) still answers at once.
    t0 = time.monotonic()
    with pytest.raises(SystemExit) as e:
        cli.main(["wait", "t", "--url", url, "--timeout", "0"])
    assert e.value.code == Exit.UNAVAILABLE and time.monotonic() - t0 < 5
    assert "waiting for the daemon" not in capsys.readouterr().err


# -- with a manager: a verified target ---------------------------------------------------------

@pytest.fixture(scope="module")
def verified(manager: UserManager, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Genready]:
    tmp = tmp_path_factory.mktemp("guard")
    unit = "tg-guard-sim.service"
    port = free_port()
    manager.install_unit(unit, sim_unit(port, "--load-seconds", "0.2"))
    manager.systemctl("restart", unit)
    g = Genready(manager, tmp, {"t": {"unit": unit, "url": f"http://127.0.0.1:{port}", **FAST}}).start()
    try:
        pid = show(manager, unit)[0]
        wait_for(lambda: g.ready_pid("t") == pid, 30, "verified")
        yield g
    finally:
        g.stop()
        manager.systemctl("stop", unit, check=False)
        manager.remove_unit(unit)


def guard(g: Genready, script: str, *extra: str, **kw: Any) -> subprocess.Popen[str]:
    return subprocess.Popen([*GENREADY, "guard", "t", "--url", g.base, *extra, "--", "sh", "-c", script],
                            stderr=subprocess.PIPE, text=True, **kw)


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGQUIT, signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_guard_ends_cmd_and_everything_it_started(verified: Genready, tmp_path: Path,
                                                                   sig: signal.Signals) -> None:
    pids = tmp_path / "pids"
    run = guard(verified, f"sleep 300 & echo $! > {pids}.tmp; mv {pids}.tmp {pids}; wait")
    try:
        wait_for(pids.exists, 20, "the command and its child started")
        forked = int(pids.read_text())
        run.send_signal(sig)
        _, err = run.communicate(timeout=30)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 128 + sig, err
    wait_for(lambda: not alive(forked), 10, "the command's child ended")


def test_a_cmd_ignoring_sigterm_is_killed_after_kill_after(verified: Genready, tmp_path: Path) -> None:
    started = tmp_path / "started"
    run = guard(verified, f"trap '' TERM; touch {started}; while :; do sleep 0.05; done", "--kill-after", "1")
    try:
        wait_for(started.exists, 20, "the command started")
        t0 = time.monotonic()
        run.send_signal(signal.SIGTERM)
        _, err = run.communicate(timeout=30)
        took = time.monotonic() - t0
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 128 + signal.SIGKILL, err
    assert 1 <= took < 10, took


def test_a_daemon_forked_by_cmd_does_not_outlive_guard(verified: Genready, tmp_path: Path) -> None:
    pidfile = tmp_path / "daemon.pid"
    run = guard(verified, f"sleep 300 & echo $! > {pidfile}; exit 0")
    _, err = run.communicate(timeout=60)
    assert run.returncode == 0, err
    assert "leaving 1 process" in err, err
    wait_for(lambda: not alive(int(pidfile.read_text())), 10, "the forked daemon ended")


def test_guard_exits_137_when_cmd_is_sigkilled(verified: Genready) -> None:
    run = guard(verified, "kill -9 $$")
    _, err = run.communicate(timeout=60)
    assert run.returncode == 137, err


@pytest.mark.parametrize("how", OUTPUTS)
def test_guard_says_75_whoever_reads_stderr(verified: Genready, manager: UserManager, how: str) -> None:
    # Readiness lost while CMD runs (the unit restarted): 75 whether or not anyone reads why.
    unit = verified.status()["targets"]["t"]["unit"]
    old = show(manager, unit)[0]
    flag = verified.tmp / f"restarted-{how}"
    script = f"while [ ! -e {flag} ]; do sleep 0.05; done"
    args = ["guard", "t", "--url", verified.base, "--", "sh", "-c", script]
    result: list[tuple[int, str]] = []
    t = threading.Thread(target=lambda: result.append(exit_status_with(args, 2, how)))
    t.start()
    try:
        wait_for(lambda: _guarded_running(script), 20, "the guarded command running")
        manager.systemctl("restart", unit)
        wait_for(lambda: verified.ready_pid("t") not in (None, old), 30, "the new start verified")
    finally:
        flag.touch()
        t.join(60)
    assert result and result[0][0] == Exit.TEMPFAIL, result


def _guarded_running(script: str) -> bool:
    """Is `sh -c script` running? That very command line: guard's own holds the script too, and
    it exists before guard has seen the target ready and started the command."""
    cmdline = b"\0".join([b"sh", b"-c", script.encode()]) + b"\0"
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (d / "cmdline").read_bytes() == cmdline:
                    return True
            except OSError:
                pass
    return False


@pytest.mark.parametrize("how", OUTPUTS)
def test_wait_says_0_whoever_reads_stdout(verified: Genready, how: str) -> None:
    rc, err = exit_status_with(["wait", "t", "--url", verified.base, "--timeout", "10"], 1, how)
    assert rc == 0 and "Traceback" not in err, err


def test_wait_across_a_daemon_restart(verified: Genready, tmp_path: Path) -> None:
    verified.stop()
    err = tmp_path / "wait.err"
    try:
        with err.open("w") as f:
            run = subprocess.Popen([*GENREADY, "wait", "t", "--url", verified.base, "--timeout", "60"],
                                   stdout=subprocess.PIPE, stderr=f, text=True)
        wait_for(lambda: "waiting for the daemon" in err.read_text(), 20, "wait saying it waits for the daemon")
        assert run.poll() is None
    finally:
        verified.start()
    out, _ = run.communicate(timeout=60)
    assert run.returncode == 0, err.read_text()
    assert "ready pid" in out, out


# -- a unit edited and reloaded, not restarted ---------------------------------------------------

def test_an_edited_unit_is_flagged_still_ready_and_guard_refuses_it(manager: UserManager, tmp_path: Path) -> None:
    unit = "tg-config-sim.service"
    port = free_port()

    def install(value: str) -> None:
        manager.install_unit(unit, sim_unit(port, "--load-seconds", "0.2", extra=f"Environment=A={value}"))

    install("1")
    manager.systemctl("restart", unit)
    g = Genready(manager, tmp_path, {"t": {"unit": unit, "url": f"http://127.0.0.1:{port}", **FAST}}).start()
    try:
        pid = show(manager, unit)[0]
        wait_for(lambda: g.ready_pid("t") == pid, 30, "verified")
        assert g.get("/ready/t")[1]["config_changed_since_start"] is False

        install("2")  # edited and daemon-reloaded; the process still runs with A=1
        wait_for(lambda: g.get("/ready/t")[1].get("config_changed_since_start"), 20, "the change noticed")
        code, body = g.get("/ready/t")
        assert code == 200 and body["pid"] == pid  # still ready: it is the verified instance
        assert body["config_changes"] == ["Environment: A=1 is now A=2"], body
        assert g.status()["targets"]["t"]["config_changed_since_start"] is True
        assert metric(g, "genready_config_changed_since_start", target="t") == 1
        run = subprocess.run([*GENREADY, "guard", "t", "--url", g.base, "--", "true"], capture_output=True,
                             text=True, timeout=30)
        assert run.returncode == Exit.TEMPFAIL and "does not run its unit's configuration" in run.stderr, run
        status = subprocess.run([*GENREADY, "status", "--url", g.base], capture_output=True, text=True, timeout=30)
        assert "warning: t: tg-config-sim.service changed since pid" in status.stdout, status

        # Edited, reloaded and restarted at once (the sweep's way): the new start runs A=3, not flagged.
        install("3")
        manager.systemctl("restart", unit)
        new = wait_for(lambda: (p := show(manager, unit)[0]) not in (0, pid) and p, 20, "a new MainPID")
        wait_for(lambda: g.ready_pid("t") == new, 30, "the new start verified")
        code, body = g.get("/ready/t")
        assert body["config_changed_since_start"] is False, body
        assert metric(g, "genready_config_changed_since_start", target="t") == 0
        assert g.records("t")[0]["environment"] == ["A=3"]
    finally:
        g.stop()
        manager.systemctl("stop", unit, check=False)
        manager.remove_unit(unit)
