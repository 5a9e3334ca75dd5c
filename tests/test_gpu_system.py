"""The GPU side against real processes: the nvidia-smi provider over a stand-in executable on PATH
(these machines have no GPU; it prints NVIDIA's documented CSV from a file the test writes), and a
real systemd unit whose earlier start leaves processes behind that "hold GPU memory"."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from genready.gpu.provider import MIB, ComputeProcess, GpuUnavailable
from genready.gpu.sampling import Sampler
from genready.gpu.smi import SmiProvider
from genready.gpu.watch import GpuWatch, starts_of
from genready.probe.owner import descendants
from genready.rule.history import History
from genready.store.records import RecordStore
from genready.systemd.control import Client
from genready.systemd.snapshot import Snapshot
from genready_dev import nvidia_smi
from genready_dev.harness import wait_for
from genready_dev.usermanager import UserManager, _hierarchies

pytestmark = pytest.mark.system

GPU0 = "GPU-8a4c5e1f-0b7e-2d3c-9f61-5b2e7d3a9c10"
GPU1 = "GPU-1f0e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"


def gpu(index: int, uuid: str, used: int, throttle: str = "0x0000000000000001") -> dict[str, object]:
    return {"index": index, "uuid": uuid, "memory_used_mib": used, "memory_total_mib": 143771,
            "utilization_pct": 0, "power_w": 70.53, "sm_clock_mhz": 345, "temperature_c": 31, "throttle": throttle}


@pytest.fixture
def smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stand-in nvidia-smi first on PATH; returns the state file it answers from."""
    state = tmp_path / "smi.json"
    nvidia_smi.write_state(state, {"gpus": [], "apps": []})
    nvidia_smi.install(tmp_path / "bin", state)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    return state


def test_the_smi_provider_reads_the_documented_csv(smi: Path) -> None:
    nvidia_smi.write_state(smi, {"gpus": [gpu(0, GPU0, 81000, "0x0000000000000004"), gpu(1, GPU1, 0)],
                                 "apps": [{"gpu_uuid": GPU0, "pid": 4242, "used_mib": 80000},
                                          {"gpu_uuid": GPU1, "pid": 4243, "used_mib": None}]})
    p = SmiProvider()
    assert p.processes() == [ComputeProcess(GPU0, 4242, 80000 * MIB), ComputeProcess(GPU1, 4243, None)]
    g0, g1 = p.samples()
    assert (g0.uuid, g0.memory_used_bytes, g0.power_w, g0.throttled) == (GPU0, 81000 * MIB, 70.53, True)
    assert (g1.index, g1.throttled) == (1, False)


def test_a_driver_that_knows_the_reasons_only_by_their_new_name_is_asked_so(smi: Path) -> None:
    nvidia_smi.write_state(smi, {"gpus": [gpu(0, GPU0, 1, "0x0000000000000040")],
                                 "throttle_field": "clocks_event_reasons.active"})
    p = SmiProvider()
    assert p.samples()[0].throttle_reasons == 0x40
    assert p._throttle_field == "clocks_event_reasons.active"  # remembered: one query next time


@pytest.mark.parametrize("body,why", [("exec sleep 30", "within 0.5 s"), ("exec yes", "more than")])
def test_an_nvidia_smi_that_hangs_or_floods_is_cut_off(tmp_path: Path, body: str, why: str) -> None:
    shim = tmp_path / "nvidia-smi"
    shim.write_text(f"#!/bin/sh\n{body}\n")
    shim.chmod(0o755)
    t0 = time.monotonic()
    with pytest.raises(GpuUnavailable, match=why):
        SmiProvider(str(shim), timeout=0.5).processes()
    assert time.monotonic() - t0 < 5


def test_a_failing_nvidia_smi_is_unavailable_with_what_it_said(tmp_path: Path) -> None:
    shim = tmp_path / "nvidia-smi"
    shim.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'"
                    " >&2\nexit 9\n")
    shim.chmod(0o755)
    with pytest.raises(GpuUnavailable, match="exited 9: NVIDIA-SMI has failed"):
        SmiProvider(str(shim)).processes()


@contextlib.contextmanager
def escaped_cgroup(manager: UserManager) -> Iterator[list[Path]]:
    """A cgroup of no unit beside the manager's own (in each hierarchy systemd uses): where a
    process that escaped its unit's cgroup (SGLang #23627) ends up. Removed afterwards."""
    assert manager.proc is not None
    dirs = [h / f"genready-um-{manager.proc.pid}" / "escaped" for h in _hierarchies()]
    for d in dirs:
        d.mkdir()
    try:
        yield dirs
    finally:
        for d in dirs:
            for pid in (d / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            procs = d / "cgroup.procs"
            wait_for(lambda: not procs.read_text().strip(), 10, f"{d} empty")  # noqa: B023  (called at once)
            d.rmdir()


def running(s: Snapshot, after: Snapshot | None = None) -> Snapshot | None:
    """s, if it shows a running start (other than `after`'s)."""
    new = after is None or s.invocation_id != after.invocation_id
    return s if new and s.active_state == "active" and s.main_pid else None


def two(pids: list[int]) -> list[int] | None:
    return pids if len(pids) == 2 else None


def test_a_stray_of_an_earlier_start_is_named_with_that_starts_invocation(
        manager: UserManager, smi: Path, tmp_path: Path) -> None:
    unit, other = "gpullm.service", "gpuother.service"
    # KillMode=process: a restart kills only the MainPID, and its children stay, as an LLM
    # server's scheduler processes do when they ignore the stop or escape the cgroup.
    manager.install_unit(unit, "[Service]\nExecStart=/bin/sh -c 'sleep 600 & sleep 602 & exec sleep 601'\n"
                               "KillMode=process\n")
    manager.install_unit(other, "[Service]\nExecStart=/bin/sleep 603\n")
    store = RecordStore(tmp_path / "state")
    store.load()
    history = History("llm", unit, store)
    leftovers: list[int] = []
    try:
        with Client("user") as client, escaped_cgroup(manager) as escape:
            manager.systemctl("start", unit, other)
            first = wait_for(lambda: running(client.read(unit)), 10, "the first start")
            history.observe(first)
            kids = wait_for(lambda: two(descendants(first.main_pid)), 10, "its two children")
            leftovers += kids
            watch = GpuWatch(SmiProvider())
            assert watch.record_tree("llm", first.invocation_id, first.main_pid) == 3
            stayed, escaped = sorted(kids)  # `sleep 600` was forked first
            for d in escape:
                (d / "cgroup.procs").write_text(str(escaped))
            # Let the first start be measurably older than the second (a process's start time is
            # known to 10 ms; a real server runs for minutes before it is restarted).
            wait_for(lambda: time.time() > first.exec_main_start_us / 1e6 + 0.3, 5, "0.3 s into the first start")
            manager.systemctl("restart", unit)
            second = wait_for(lambda: running(client.read(unit), after=first), 10, "the second start")
            history.observe(second)
            other_pid = int(manager.show(other, "MainPID")["MainPID"])
            nvidia_smi.write_state(smi, {"gpus": [gpu(0, GPU0, 0), gpu(1, GPU1, 0)], "apps": [
                {"gpu_uuid": GPU0, "pid": stayed, "used_mib": 70000},
                {"gpu_uuid": GPU1, "pid": escaped, "used_mib": 5000},
                {"gpu_uuid": GPU0, "pid": second.main_pid, "used_mib": 1000},
                {"gpu_uuid": GPU0, "pid": other_pid, "used_mib": 2000},
            ]})
            cgroup = manager.show(unit, "ControlGroup")["ControlGroup"]
            targets = [starts_of("llm", unit, store.all("llm"), second.invocation_id, cgroup)]
            reading = asyncio.run(watch.refresh(targets))
            # Without the recorded tree: the cgroup still tells the first; the escaped one is lost.
            bare = {h.pid: h for h in asyncio.run(GpuWatch(SmiProvider()).refresh(targets)).holdings}
    finally:
        # KillMode=process: a stop would leave the children; kill every process of the cgroup first.
        manager.systemctl("kill", "--kill-whom=all", "--signal=SIGKILL", unit, check=False)
        manager.systemctl("stop", unit, other, check=False)
        for pid in leftovers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        manager.remove_unit(unit)
        manager.remove_unit(other)
        store.close()
    assert reading.error is None
    by_pid = {h.pid: h for h in reading.holdings}
    assert (by_pid[stayed].role, by_pid[stayed].invocation_id) == ("stray", first.invocation_id), by_pid[stayed]
    assert by_pid[stayed].unit == unit and "sleep 600" in by_pid[stayed].command
    assert (by_pid[escaped].role, by_pid[escaped].invocation_id) == ("stray", first.invocation_id), by_pid[escaped]
    assert by_pid[escaped].unit is None and by_pid[escaped].why == "recorded in that start's process tree"
    assert (bare[stayed].role, bare[stayed].invocation_id) == ("stray", first.invocation_id), bare[stayed]
    assert bare[stayed].why == f"in {unit}'s cgroup, begun during that start"
    assert bare[escaped].role == "other"
    assert (by_pid[second.main_pid].role, by_pid[second.main_pid].invocation_id) == ("current", second.invocation_id)
    assert (by_pid[other_pid].role, by_pid[other_pid].unit) == ("other", other)
    llm = reading.targets["llm"]
    assert llm.current_bytes == {GPU0: 1000 * MIB}
    assert llm.stray_bytes() == {GPU0: 70000 * MIB, GPU1: 5000 * MIB}


def test_throttling_during_a_run_marks_the_run_throttled(smi: Path) -> None:
    nvidia_smi.write_state(smi, {"gpus": [gpu(0, GPU0, 1000)]})
    with Sampler(SmiProvider(), interval=0.05) as s:
        wait_for(lambda: len(s.timeline) >= 2, 10, "two samples before")
        nvidia_smi.write_state(smi, {"gpus": [gpu(0, GPU0, 90000, "0x0000000000000004")]})  # SW power cap
        wait_for(lambda: any(x.throttled for _, xs in s.timeline for x in xs), 10, "a throttled sample")
    r = s.summary(output_tokens=5000)
    assert r.throttled and r.throttle_reasons == 0x5 and r.peak_memory_bytes == 90000 * MIB
    assert r.energy_j is not None and r.tokens_per_joule == 5000 / r.energy_j and r.errors == 0
