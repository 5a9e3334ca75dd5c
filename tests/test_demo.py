"""`genready demo --fast` for real: its own systemd user manager, units, genready and the bench path.

The demo checks its own story and exits 1 when it does not hold; this test also reads the
printed timeline, as a person would, and checks that nothing the demo started is left behind.
"""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from genready.tools import benchclient
from genready_dev import demo
from genready_dev.harness import GENREADY, env_without_notify, wait_for
from genready_dev.usermanager import UserManager, unavailable_reason
from tests import ci

FAST_BUDGET = 30.0  # seconds: the demo's CI smoke mode must stay cheap


def needs_manager() -> None:
    ci.require(unavailable_reason(), "the demo (it needs a private systemd user manager)")


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line or environment contains `text` (e.g. the demo's temp dir)."""
    found = []
    needle = text.encode()
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        for what in ("cmdline", "environ"):
            try:
                if needle in Path(f"/proc/{pid}/{what}").read_bytes():
                    found.append(int(pid))
                    break
            except OSError:
                continue
    return found


def run_demo(*args: str, timeout: float = 90.0) -> tuple[int, str, str, float]:
    """(exit status, stdout, stderr, seconds). On timeout SIGTERM first: the demo cleans up on it."""
    t0 = time.monotonic()
    proc = subprocess.Popen([*GENREADY, "demo", *args], env=env_without_notify(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        pytest.fail(f"genready demo {' '.join(args)} took over {timeout}s\n{out}\n{err}")
    return proc.returncode, out, err, time.monotonic() - t0


@pytest.mark.system
def test_demo_fast_shows_the_race_and_cleans_up() -> None:
    needs_manager()
    rc, out, err, took = run_demo("--fast")
    assert rc == 0, f"exit {rc}\n--- stdout\n{out}\n--- stderr\n{err}"
    assert took < FAST_BUDGET, f"demo --fast took {took:.1f}s\n{out}"
    assert "Traceback" not in err

    lines = out.splitlines()
    rows = [line for line in lines if re.match(r"^\s*[+-]\d+\.\d\ds  ", line)]
    assert rows, out

    def first(pattern: str) -> tuple[int, re.Match[str]]:
        for i, row in enumerate(rows):
            m = re.search(pattern, row)
            if m:
                return i, m
        raise AssertionError(f"no timeline row matches {pattern!r}:\n{out}")

    # One restart, one new start: each kind of event is one row (the bench client's progress
    # lines are no start of it, its result no second result).
    once = {
        "the old pid's SIGTERM": r"sim: old pid \d+ got SIGTERM",
        "the old pid's exit": r"sim: old pid \d+ exited",
        "the new pid loading": r"sim: new pid \d+: loading weights",
        "the new pid loaded": r"sim: new pid \d+ finished",
        "genready's READY": r"genready: READY: pid",
        "naive's first 200": r"naive: 200 from ",
        "the bench's start": r"bench: \S+ started by the path unit",
        "the bench's result": r"bench: \d+/\d+ requests ok",
    }
    counts = {what: sum(1 for row in rows if re.search(pattern, row)) for what, pattern in once.items()}
    assert counts == dict.fromkeys(once, 1), f"{counts}\n{out}"
    assert sum(1 for row in rows if "run skipped" in row) <= 1, out

    i_naive, m = first(r"naive: 200 from the OLD pid (\d+): the script says READY")
    old = int(m[1])
    i_ready, m = first(r"genready: READY: pid (\d+) served a real generation")
    new = int(m[1])
    assert new != old
    assert i_naive < i_ready, "the naive READY (old pid) must come before genready's READY (new pid)"
    _, m = first(r"sim: new pid (\d+) finished loading: it can generate now")
    assert int(m[1]) == new
    i_bench, m = first(r"bench: (\d+)/(\d+) requests ok, .*; measured pid (\d+)$")
    assert int(m[3]) == new and m[1] == m[2]
    assert i_bench > i_ready

    # The cells say what each check answered after each event: once genready's first answer
    # after the restart arrived (a 503), never READY for the old pid again, and READY for the
    # new pid only from its own row on.
    i_restart, _ = first(r"script: systemctl --user restart --no-block")
    i_revoked, _ = first(rf"genready: 503, not ready \(pid {old}\)")
    assert i_restart < i_revoked < i_ready
    for i, row in enumerate(rows[i_revoked:], start=i_revoked):
        assert f"READY {old} " not in row, row
        assert (f"READY {new} " in row) == (i >= i_ready), row

    m_verdict = re.search(r"^VERDICT .*?(?=\n\n)", out, re.M | re.S)
    assert m_verdict, out
    verdict = " ".join(m_verdict[0].split())
    assert re.search(r"said READY \d+\.\d s before the new server could generate", verdict), verdict
    assert f"the OLD pid {old} answered it" in verdict
    assert f"naming the NEW pid {new}, and the benchmark it triggered measured pid {new}" in verdict

    m2 = re.search(r"removed (/tmp/genready-demo-\S+) ", out)
    assert m2, out
    root = m2[1]
    assert not Path(root).exists()
    assert processes_mentioning(root) == [], f"left running: {processes_mentioning(root)}"
    assert re.search(r"^demo finished in \d+\.\d s$", out, re.M)


@pytest.mark.system
def test_demo_sweep_runs_a_2x2_sweep_in_under_a_minute_and_cleans_up() -> None:
    needs_manager()
    rc, out, err, took = run_demo("--sweep")
    assert rc == 0, f"exit {rc}\n--- stdout\n{out}\n--- stderr\n{err}"
    assert took < 60, f"demo --sweep took {took:.1f}s\n{out}"
    assert "Traceback" not in err and "4/4 points ok" in out
    rows = re.findall(r"^  token_latency=(\S+) concurrency=(\d+)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)", out, re.M)
    assert len(rows) == 4, out
    for _, _, verified, measured, ttft, itl in rows:
        assert verified == measured and float(ttft) > 0 and float(itl) > 0
    # Four points, two server settings: one verified start (one load) per setting, shared by its two concurrencies.
    by_setting = {(r[0], r[2]) for r in rows}
    assert len(by_setting) == 2 and len({r[2] for r in rows}) == 2, rows
    assert "[4/4] token_latency=0.005 concurrency=4: ok" in err  # the sweep's own progress lines
    m = re.search(r"manager in (/tmp/genready-sweep-demo-\S+) ", out)
    assert m, out
    assert not Path(m[1]).exists()
    assert processes_mentioning(m[1]) == [], f"left running: {processes_mentioning(m[1])}"


@pytest.mark.system
def test_a_failed_step_is_reported_and_everything_is_cleaned_up(monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    needs_manager()

    def broken(self: demo.Demo) -> int:
        raise demo.DemoFailed("sim.service would not start (simulated)", logs=("sim",))

    monkeypatch.setattr(demo.Demo, "start_services", broken)
    assert demo.run(fast=True) == 1
    cap = capsys.readouterr()
    assert "demo failed: sim.service would not start (simulated)" in cap.err
    assert "--- last lines of " in cap.err and "sim.log" in cap.err
    m = re.search(r"removed (/tmp/genready-demo-\S+) ", cap.out)
    assert m, cap.out
    assert not Path(m[1]).exists()
    assert processes_mentioning(m[1]) == []
    assert "demo FAILED in " in cap.out


@pytest.mark.system
def test_sigterm_mid_demo_still_cleans_up(tmp_path: Path) -> None:
    """A CI timeout or a closed terminal must not leave a systemd manager running."""
    needs_manager()
    out = tmp_path / "out.txt"
    with out.open("w") as f:
        proc = subprocess.Popen([*GENREADY, "demo", "--fast"], env=env_without_notify(), stdout=f,
                                stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: "[3/5]" in out.read_text() or proc.poll() is not None, 30, "the demo's step 3")
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = out.read_text()
    assert rc == 130, text
    assert "demo interrupted" in text and "Traceback" not in text
    m = re.search(r"removed (/tmp/genready-demo-\S+) ", text)
    assert m, text
    assert not Path(m[1]).exists()
    assert processes_mentioning(m[1]) == []


def test_the_bench_clients_output_is_one_start_and_one_result(tmp_path: Path) -> None:
    """What the bench unit's log holds, as the bench client writes it: its header, a progress line
    per 10 % (stderr, same log) and the result block. Only the header is a start."""
    args = benchclient.build_parser().parse_args(["--url", "http://127.0.0.1:1", "-n", "20", "-c", "2"])
    env = {"GENREADY_PID": "4242", "GENREADY_INVOCATION_ID": "ab" * 16, "GENREADY_UNIT": "sim.service"}
    log = io.StringIO()
    log.write(benchclient.header(args, env) + "\n")
    progress = benchclient.Progress(20, log)
    for done in range(1, 21):
        progress.update(done, 0)
    summary = benchclient.Summary(requests=20, concurrency=2, wall_seconds=1.0)
    log.write(benchclient.format_summary(summary, env))
    text = log.getvalue()
    assert text.count("/20 done") == 10, text  # the lines that used to be read as ten starts

    watch = demo.Watch(0, "http://127.0.0.1:1", tmp_path / "sim.log", tmp_path / "bench.log")
    for line in text.splitlines():
        watch._bench_line(line)
    assert [(e.kind, e.pid) for e in watch.all_events()] == [("started", 4242), ("result", 4242)]


def test_without_root_a_clear_message_and_no_traceback(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(demo, "unavailable_reason", lambda: "needs root (a private mount namespace for systemd)")
    assert demo.run(fast=True) == 1
    cap = capsys.readouterr()
    assert "genready demo: cannot run here: needs root" in cap.err
    assert "hint: " in cap.err
    assert cap.out == ""


def test_demo_units_pass_systemd_analyze_verify(manager: UserManager, tmp_path: Path) -> None:
    """The unit texts the demo writes are valid for a user manager (typos would only show at run time)."""
    ci.tool("systemd-analyze")
    layout = demo.Layout(tmp_path)
    texts = demo.unit_texts(layout, manager, demo.FULL, 9901, 30000)
    for name, text in texts.items():
        (tmp_path / name).write_text(text)
    paths = [str(tmp_path / n.replace("@.", f"@{demo.TARGET}.")) for n in texts]
    r = subprocess.run(["systemd-analyze", "--user", "verify", *paths], env=manager.env, capture_output=True,
                       text=True, timeout=60)
    ours = [line for line in (r.stdout + r.stderr).splitlines() if str(tmp_path) in line or "genready" in line]
    assert r.returncode == 0 and not ours, r.stdout + r.stderr


@pytest.mark.parametrize(("word", "expected"), [
    ("/usr/bin/python3", "/usr/bin/python3"),
    ("%i", "%i"),
    ("50%", "50%%"),
    ("/tmp/a b/python", '"/tmp/a b/python"'),
    ("$HOME", '"$$HOME"'),
    ('say "hi"', '"say \\"hi\\""'),
])
def test_exec_words_are_escaped_for_systemd(word: str, expected: str) -> None:
    assert demo.exec_arg(word) == expected
