"""The GPU watch in the daemon (issue 40) against a real systemd unit whose earlier start leaves a
process behind that "holds GPU memory" per the stand-in nvidia-smi on PATH (these machines have no
GPU; genready_dev/nvidia_smi.py prints NVIDIA's documented CSV): /status (to its contract),
`genready status`, the metric, and the record of the next start, which fails, name it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from genready.client import progress, waiting
from genready.gpu.provider import MIB
from genready.probe.owner import descendants
from genready_dev import nvidia_smi
from genready_dev.harness import GENREADY, PY, Genready, free_port, http, show, wait_for
from genready_dev.usermanager import UserManager, _hierarchies
from tests.test_api import conforms, response_schema

pytestmark = pytest.mark.system

UNIT = "gd-llm.service"
GPU0 = "GPU-8a4c5e1f-0b7e-2d3c-9f61-5b2e7d3a9c10"
FAST = {"backoff_initial": 0.05, "backoff_max": 0.3, "probe_timeout": 2.0, "verify_owner": False}


def gpu(used: int) -> dict[str, object]:
    return {"index": 0, "uuid": GPU0, "memory_used_mib": used, "memory_total_mib": 143771, "utilization_pct": 0,
            "power_w": 70.5, "sm_clock_mhz": 345, "temperature_c": 31, "throttle": "0x0000000000000001"}


@pytest.fixture
def smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stand-in nvidia-smi first on PATH (genready inherits it); the state file it answers from."""
    state = tmp_path / "smi.json"
    nvidia_smi.write_state(state, {"gpus": [gpu(0)], "apps": []})
    nvidia_smi.install(tmp_path / "bin", state)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    return state


@pytest.fixture
def llm(manager: UserManager, tmp_path: Path) -> Iterator[Path]:
    """A unit whose start forks a child that outlives a restart (KillMode=process: an LLM server's
    scheduler that ignores the stop), and which fails at once while `fail` exists; that path."""
    fail = tmp_path / "fail"
    manager.install_unit(UNIT, "[Unit]\nStartLimitIntervalSec=0\n[Service]\nKillMode=process\n"
                               f"ExecStart=/bin/sh -c 'if [ -e {fail} ]; then echo CUDA out of memory >&2; exit 1; fi;"
                               " sleep 600 & exec sleep 601'\n")
    try:
        yield fail
    finally:
        manager.systemctl("kill", "--kill-whom=all", "--signal=SIGKILL", UNIT, check=False)
        manager.systemctl("stop", UNIT, check=False)
        manager.systemctl("reset-failed", UNIT, check=False)
        manager.remove_unit(UNIT)


def running(manager: UserManager, after: str = "", unit: str = UNIT) -> tuple[int, str] | None:
    """(MainPID, InvocationID) of a running start (other than `after`)."""
    pid, inv = show(manager, unit)
    return (pid, inv) if pid and inv != after else None


def stray_bytes(text: str) -> dict[tuple[str, str], float]:
    return {(s.labels["target"], s.labels["gpu"]): s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == "genready_gpu_stray_bytes"}


def test_a_stray_of_an_earlier_start_is_named_everywhere(manager: UserManager, smi: Path, llm: Path,
                                                         tmp_path: Path) -> None:
    g = Genready(manager, tmp_path, {"llm": {"unit": UNIT, "url": f"http://127.0.0.1:{free_port()}", **FAST}},
                 gpu_interval=0.5)
    g.start()
    stray = 0
    try:
        manager.systemctl("start", UNIT)
        first_pid, first = wait_for(lambda: running(manager), 10, "the first start")
        (stray,) = wait_for(lambda: descendants(first_pid) or None, 10, "its child")
        # A process's start time is known to 10 ms: let the first start be measurably older than the next.
        seen = time.time()
        wait_for(lambda: time.time() > seen + 0.3, 5, "0.3 s into the first start")
        manager.systemctl("restart", UNIT)
        second_pid, second = wait_for(lambda: running(manager, first), 10, "the second start")
        nvidia_smi.write_state(smi, {"gpus": [gpu(71000)], "apps": [
            {"gpu_uuid": GPU0, "pid": stray, "used_mib": 70000},
            {"gpu_uuid": GPU0, "pid": second_pid, "used_mib": 1000}]})

        def named() -> dict[str, Any] | None:
            t = g.status()["targets"]["llm"]
            gp = t.get("gpu") or {}
            return t if [h["pid"] for h in gp.get("strays", [])] == [stray] and gp.get("current_bytes") else None
        t = wait_for(named, 20, lambda: f"/status naming the stray {stray}: {g.status()['targets']['llm'].get('gpu')}")
        h = t["gpu"]["strays"][0]
        assert (h["gpu"], h["bytes"], h["invocation_id"], h["unit"]) == (GPU0, 70000 * MIB, first, UNIT), h
        assert "sleep 600" in h["command"] and f"kill {stray}" in h["line"]
        assert t["gpu"]["current_bytes"] == {GPU0: 1000 * MIB}
        code, body = g.get("/status")
        assert conforms(body, response_schema("/status", code)) == []

        out = subprocess.run([*GENREADY, "status", "--url", g.base], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0 and f"kill {stray}" in out.stdout and "STRAY PID" in out.stdout, out.stdout

        code, text = g.get("/metrics")
        assert code == 200 and stray_bytes(text) == {("llm", GPU0): 70000 * MIB}, text

        # The next start fails (as a CUDA out-of-memory would): its record names the stray.
        llm.touch()
        since = time.time()
        manager.systemctl("restart", UNIT, check=False)

        def failed() -> dict[str, Any] | None:
            f = g.status()["targets"]["llm"]["last_failure"]
            return f if f and f["invocation_id"] not in (first, second) and f.get("gpu_strays") else None
        f = wait_for(failed, 20, lambda: f"the failed start's record: {g.status()['targets']['llm']['last_failure']}")
        assert [s["pid"] for s in f["gpu_strays"]] == [stray] and f["gpu_strays"][0]["invocation_id"] == first
        code, body = http(f"{g.base}/ready/llm?since={since}&wait=10", 15)
        assert code == 503 and body["start_failed"]["gpu_strays"][0]["pid"] == stray, body
        assert conforms(body, response_schema("/ready/{target}", 503)) == []
        # `restart` and `wait`'s live line and their last words show it.
        assert f"stray PID {stray}" in progress.target_line(body)
        assert any(f"kill {stray}" in line for line in waiting.failure_lines(body["start_failed"]))
    finally:
        g.stop()
        if stray:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stray, signal.SIGKILL)


def test_a_unit_of_the_same_name_under_another_manager_is_neither_current_nor_a_stray(
        manager: UserManager, smi: Path, tmp_path: Path) -> None:
    """Issue 53 §5: another manager (here a second private one; on a host, a user's) runs a unit of the
    target's name. Its processes are in a cgroup whose innermost unit has that name, but not in the
    target's ControlGroup: not the target's memory, and no stray of it (no `kill` of someone else's job).
    A process that is in the target's own cgroup, and tied to it by nothing else, still is a stray."""
    target = "gd-same.service"
    manager.install_unit(target, "[Service]\nExecStart=/bin/sleep 602\n")
    g = Genready(manager, tmp_path, {"llm": {"unit": target, "url": f"http://127.0.0.1:{free_port()}", **FAST}},
                 gpu_interval=0.3)
    other = UserManager(tmp_path / "other-manager")
    other.start()
    theirs: list[int] = []
    lodger = subprocess.Popen(["sleep", "600"])  # moved into the target's cgroup below: no descendant of its start
    try:
        # KillMode=process: its restart leaves its first child behind, begun before the target's start.
        other.install_unit(target, "[Service]\nKillMode=process\nExecStart=/bin/sh -c 'sleep 600 & exec sleep 601'\n")
        other.systemctl("start", target)
        old_main, old_inv = wait_for(lambda: running(other, unit=target), 10, "the other manager's unit")
        (old_child,) = wait_for(lambda: descendants(old_main) or None, 10, "its child")
        theirs.append(old_child)
        seen = time.time()
        wait_for(lambda: time.time() > seen + 0.3, 5, "0.3 s on")
        g.start()  # before the target's start: systemd names its ControlGroup only once it runs
        manager.systemctl("start", target)
        main, inv = wait_for(lambda: running(manager, unit=target), 10, "the target's start")
        cgroup = manager.show(target, "ControlGroup")["ControlGroup"]
        for h in _hierarchies():
            (h / cgroup.lstrip("/") / "cgroup.procs").write_text(str(lodger.pid))
        seen = time.time()
        wait_for(lambda: time.time() > seen + 0.3, 5, "0.3 s into the target's start")
        other.systemctl("restart", target)  # a process of theirs begun during the target's current start
        new_main, _ = wait_for(lambda: running(other, old_inv, unit=target), 10, "the other unit's restart")
        theirs.append(new_main)
        text = Path(f"/proc/{new_main}/cgroup").read_text()
        assert target in text and cgroup not in text, text  # the same unit name, another cgroup
        nvidia_smi.write_state(smi, {"gpus": [gpu(76000)], "apps": [
            {"gpu_uuid": GPU0, "pid": old_child, "used_mib": 70000},
            {"gpu_uuid": GPU0, "pid": new_main, "used_mib": 5000},
            {"gpu_uuid": GPU0, "pid": main, "used_mib": 1000},
            {"gpu_uuid": GPU0, "pid": lodger.pid, "used_mib": 300}]})

        def read() -> dict[str, Any] | None:
            gp = g.status()["targets"]["llm"].get("gpu") or {}
            return gp if gp.get("current_bytes") and gp.get("strays") else None
        gp = wait_for(read, 20, lambda: f"a reading of the apps: {g.status()['targets']['llm'].get('gpu')}")
        assert [(h["pid"], h["bytes"], h["invocation_id"]) for h in gp["strays"]] == [(lodger.pid, 300 * MIB, None)], gp
        assert f"in {target}'s cgroup" in gp["strays"][0]["why"], gp
        assert gp["current_bytes"] == {GPU0: 1000 * MIB}, gp
        code, metrics = g.get("/metrics")
        assert code == 200 and stray_bytes(metrics) == {("llm", GPU0): 300 * MIB}, metrics
        assert show(manager, target) == (main, inv)
    finally:
        g.stop()
        lodger.kill()
        lodger.wait()
        other.systemctl("kill", "--kill-whom=all", "--signal=SIGKILL", target, check=False)
        other.stop()
        for pid in theirs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        manager.systemctl("stop", target, check=False)
        manager.remove_unit(target)


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this host has an nvidia-smi")
def test_without_nvidia_smi_the_daemon_shows_nothing_and_says_so_once(manager: UserManager, llm: Path,
                                                                       tmp_path: Path) -> None:
    g = Genready(manager, tmp_path, {"llm": {"unit": UNIT, "url": f"http://127.0.0.1:{free_port()}", **FAST}},
                 gpu_interval=0.2)
    g.start()
    try:
        manager.systemctl("start", UNIT)
        wait_for(lambda: show(manager, UNIT)[0], 10, "a start")
        manager.systemctl("restart", UNIT)
        wait_for(lambda: g.log().count("no GPU processes are read on this host") == 1, 10, "the one line")
        assert g.status()["targets"]["llm"]["gpu"] is None
        code, text = g.get("/metrics")
        assert code == 200 and stray_bytes(text) == {}
        assert g.log().count("no GPU processes are read") == 1 and "cannot read the GPUs" not in g.log()
    finally:
        g.stop()


SWEEP_UNIT = "gd-sweep.service"
# The point's "benchmark": notes that it ran, writes a bench client's line, and runs for 1.5 s (two
# GPU samples at least, a second apart).
BENCH = str(Path(__file__).with_name("gpu_bench_stub.py"))


def test_the_sweep_waits_for_strays_then_refuses_to_load_next_to_them(manager: UserManager, smi: Path,
                                                                      tmp_path: Path) -> None:
    port = free_port()
    # The simulator as the server, with a child that outlives a restart (KillMode=process).
    manager.install_unit(SWEEP_UNIT, "[Unit]\nStartLimitIntervalSec=0\n[Service]\nKillMode=process\n"
                                     f"ExecStart=/bin/sh -c 'sleep 600 & exec {PY} -m genready.cli simulate "
                                     f"--port {port} --load-seconds 0.2'\n")
    g = Genready(manager, tmp_path, {"t": {"unit": SWEEP_UNIT, "url": f"http://127.0.0.1:{port}", **FAST}},
                 gpu_interval=0.3)
    g.start()
    stray = 0
    try:
        manager.systemctl("start", SWEEP_UNIT)
        pid, _ = wait_for(lambda: running(manager, unit=SWEEP_UNIT), 10, "a start")
        (stray,) = wait_for(lambda: [c for c in descendants(pid) if b"sleep" in
                                     Path(f"/proc/{c}/cmdline").read_bytes()] or None, 10, "its child")
        seen = time.time()
        wait_for(lambda: time.time() > seen + 0.3, 5, "0.3 s into the first start")
        manager.systemctl("restart", SWEEP_UNIT)
        wait_for(lambda: g.ready_pid("t") not in (None, pid), 20, "the second start verified")
        nvidia_smi.write_state(smi, {"gpus": [gpu(70000)], "apps": [{"gpu_uuid": GPU0, "pid": stray,
                                                                     "used_mib": 70000}]})
        wait_for(lambda: (g.status()["targets"]["t"]["gpu"] or {}).get("strays"), 20, "the stray in /status")
        marker = tmp_path / "ran"
        plan = tmp_path / "plan.toml"
        plan.write_text(f'target = "t"\ntimeout = 20\nstray_wait = 1\npoints = [{{n = 1}}]\n'
                        f'command = ["{PY}", "{BENCH}", "{marker}", "{{out}}"]\n')
        argv = [*GENREADY, "sweep", str(plan), "--config", str(g.config_path)]

        # 1. It waits stray_wait, then stops (exit 1) naming the stray and how to end it; nothing loads or runs.
        restarts = int(manager.show(SWEEP_UNIT, "NRestarts")["NRestarts"])
        inv = show(manager, SWEEP_UNIT)[1]
        r = subprocess.run([*argv, "--results", str(tmp_path / "r1")], env=manager.env, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 1, (r.stdout, r.stderr)
        assert f"PID {stray}" in r.stderr and f"kill {stray}" in r.stderr and "stray_wait" in r.stderr, r.stderr
        assert not marker.exists() and show(manager, SWEEP_UNIT)[1] == inv  # no restart: no load
        assert int(manager.show(SWEEP_UNIT, "NRestarts")["NRestarts"]) == restarts
        (line,) = [json.loads(x) for x in (tmp_path / "r1" / "results.jsonl").read_text().splitlines()]
        assert line["status"] == "not_ready" and f"PID {stray}" in line["reason"], line
        assert Path(f"/proc/{stray}").exists()  # never killed

        # 2. A stray that exits while the sweep waits: the sweep goes on.
        err = tmp_path / "wait.err"
        plan.write_text(plan.read_text().replace("stray_wait = 1", "stray_wait = 60"))
        with err.open("w") as e:
            p = subprocess.Popen([*argv, "--results", str(tmp_path / "r2")], env=manager.env, stderr=e,
                                 stdout=subprocess.PIPE, text=True)
        wait_for(lambda: "waiting up to 60 s" in err.read_text(), 30, lambda: f"the sweep waiting: {err.read_text()}")
        os.kill(stray, signal.SIGKILL)
        nvidia_smi.write_state(smi, {"gpus": [gpu(0)], "apps": []})
        out, _ = p.communicate(timeout=60)
        assert p.returncode == 0, (out, err.read_text())
        assert marker.read_text() == "ran\n"

        # 3. --ignore-strays: loads and runs next to one; the GPUs, sampled each second, are throttled (SW
        # power cap) during the run: its line has the run's GPU cost and the mark, and the report shows them.
        nvidia_smi.write_state(smi, {"gpus": [{**gpu(70000), "throttle": "0x0000000000000004"}], "apps": [
            {"gpu_uuid": GPU0, "pid": stray, "used_mib": 70000}]})
        r = subprocess.run([*argv, "--results", str(tmp_path / "r3"), "--ignore-strays"], env=manager.env,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert marker.read_text() == "ran\nran\n"
        (line,) = [json.loads(x) for x in (tmp_path / "r3" / "results.jsonl").read_text().splitlines()]
        assert line["throttled"] is True and line["peak_gpu_memory_bytes"] == 70000 * MIB, line
        assert line["mean_power_w"] == pytest.approx(70.5) and line["gpu_samples"] >= 2, line
        assert line["energy_j"] > 0 and line["tokens_per_joule"] == pytest.approx(5000 / line["energy_j"]), line
        doc = json.loads((tmp_path / "r3" / line["out"] / "gpu.json").read_text())
        assert doc["provider"] == "nvidia-smi" and doc["samples"][0]["gpus"][0]["uuid"] == GPU0, doc
        rep = subprocess.run([*GENREADY, "sweep", "report", str(tmp_path / "r3")], capture_output=True, text=True,
                             timeout=30)
        assert rep.returncode == 0 and "TOK/J" in rep.stdout and "~ throttled" in rep.stdout, rep.stdout
        assert f"{line['tokens_per_joule']:.3f}~" in rep.stdout, rep.stdout
    finally:
        g.stop()
        manager.systemctl("kill", "--kill-whom=all", "--signal=SIGKILL", SWEEP_UNIT, check=False)
        manager.systemctl("stop", SWEEP_UNIT, check=False)
        manager.remove_unit(SWEEP_UNIT)
        if stray:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stray, signal.SIGKILL)
