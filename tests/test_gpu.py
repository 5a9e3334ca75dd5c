"""The GPU side, in process: nvidia-smi's documented CSV parsed, the NVML provider over a fake of
pynvml, and the attribution of GPU processes to a unit's starts (pure functions)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from genready.gpu import attribution
from genready.gpu.attribution import Proc, Start, TargetStarts, attribute, per_target, read_proc, unit_of_cgroup
from genready.gpu.nvml import NvmlProvider
from genready.gpu.provider import MIB, ComputeProcess, GpuSample, GpuUnavailable
from genready.gpu.sampling import Sampler, summarise
from genready.gpu.smi import SmiProvider, parse_apps, parse_gpus
from genready.gpu.watch import GpuReading, GpuWatch, choose, starts_of, stray_line
from genready.store.records import StartRecord
from genready.timewords import iso
from genready_dev.harness import wait_for

UUID0 = "GPU-8a4c5e1f-0b7e-2d3c-9f61-5b2e7d3a9c10"
UUID1 = "GPU-1f0e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"


# --- nvidia-smi's CSV (the lines as NVIDIA's manual documents them) --------------------------------

def test_compute_apps_lines_parse_with_memory_in_mib() -> None:
    text = f"{UUID0}, 4242, 81000\n{UUID1}, 4243, [N/A]\n"
    assert parse_apps(text) == [ComputeProcess(UUID0, 4242, 81000 * MIB), ComputeProcess(UUID1, 4243, None)]


def test_no_compute_apps_is_no_rows_either_way() -> None:
    assert parse_apps("") == []
    assert parse_apps("No running processes found\n") == []


def test_a_compute_apps_line_of_the_wrong_shape_is_an_error_naming_it() -> None:
    with pytest.raises(GpuUnavailable, match="2 fields, expected 3"):
        parse_apps(f"{UUID0}, 4242\n")
    with pytest.raises(GpuUnavailable, match="used_memory is 'lots'"):
        parse_apps(f"{UUID0}, 4242, lots\n")


def test_gpu_lines_parse_every_field_and_missing_values_are_none() -> None:
    text = (f"0, {UUID0}, 81234, 143771, 97, 612.45, 1980, 61, 0x0000000000000004\n"
            f"1, {UUID1}, 0, 143771, 0, [Not Supported], 345, 30, [N/A]\n")
    g0, g1 = parse_gpus(text)
    assert (g0.index, g0.uuid, g0.memory_used_bytes, g0.memory_total_bytes) == (0, UUID0, 81234 * MIB, 143771 * MIB)
    assert (g0.utilization_pct, g0.power_w, g0.sm_clock_mhz, g0.temperature_c) == (97, 612.45, 1980, 61)
    assert g0.throttle_reasons == 4 and g0.throttled  # 0x4: SW power cap
    assert g1.power_w is None and g1.throttle_reasons is None and not g1.throttled


def test_nan_or_not_supported_in_an_integer_field_is_null_not_an_error() -> None:
    """Issue 53 §8: `nan` (and `inf`) where a number is due is no value, like `[N/A]`."""
    (g,) = parse_gpus(f"nan, {UUID0}, nan, [Not Supported], NaN, nan, [N/A], inf, 0x0000000000000001\n")
    assert (g.index, g.memory_used_bytes, g.memory_total_bytes, g.utilization_pct) == (0, None, None, None)
    assert (g.power_w, g.sm_clock_mhz, g.temperature_c) == (None, None, None)
    assert parse_apps(f"{UUID0}, 4242, nan\n{UUID0}, nan, 100\n{UUID1}, 7, [Not Supported]\n") == [
        ComputeProcess(UUID0, 4242, None), ComputeProcess(UUID1, 7, None)]


@pytest.mark.parametrize("mask,throttled", [("0x0000000000000001", False), ("0x0000000000000002", False),
                                             ("0x0000000000000000", False), ("0x0000000000000020", True)])
def test_idle_and_application_clocks_are_not_throttling(mask: str, throttled: bool) -> None:
    (g,) = parse_gpus(f"0, {UUID0}, 0, 143771, 0, 70.1, 345, 30, {mask}\n")
    assert g.throttled is throttled


# --- NVML over a fake pynvml --------------------------------------------------------------------
# The one mock of this feature: NVML is a C library that talks to a GPU driver, and these machines
# have neither; a fake of the nine calls the provider makes is the only way to run its code here.
# The stand-in nvidia-smi (tests/test_gpu_system.py) is a real executable; bench/gpu_check.py
# compares both providers on a real GPU.

class FakeNVMLError(Exception):
    pass


@dataclass
class FakeGpu:
    uuid: str
    procs: list[tuple[int, int | None]]
    used: int = 5 * MIB
    total: int = 80 * MIB
    power_mw: int | None = 70_500
    reasons: int = 1
    energy_mj: int | None = None
    hang: threading.Event | None = None  # set: a power read blocks until it is cleared (a GPU off the bus)


class FakeNvml:
    """The part of pynvml NvmlProvider uses, over FakeGpu objects; records the threads it is called on."""

    NVMLError = FakeNVMLError
    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, gpus: list[FakeGpu], *, init_fails: bool = False) -> None:
        self.gpus, self.init_fails, self.threads, self.shut = gpus, init_fails, set[str](), False

    def _seen(self) -> None:
        self.threads.add(threading.current_thread().name)

    def nvmlInit(self) -> None:
        if self.init_fails:
            raise FakeNVMLError("Driver Not Loaded")

    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlDeviceGetCount(self) -> int:
        self._seen()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeGpu:
        return self.gpus[i]

    def nvmlDeviceGetUUID(self, h: FakeGpu) -> bytes:
        return h.uuid.encode()  # nvidia-ml-py before 11.5 gave bytes

    def nvmlDeviceGetComputeRunningProcesses(self, h: FakeGpu) -> list[Any]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in h.procs]

    nvmlMemory_v2 = 0x02000028  # as nvidia-ml-py defines it

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu, version: int | None = None) -> Any:
        # version 1 counts the driver's reserved memory as used; version 2 (what nvidia-smi shows) does not
        reserved = 0 if version == self.nvmlMemory_v2 else 600 * MIB
        return SimpleNamespace(used=h.used + reserved, total=h.total, free=h.total - h.used - reserved)

    def nvmlDeviceGetUtilizationRates(self, h: FakeGpu) -> Any:
        return SimpleNamespace(gpu=42, memory=7)

    def nvmlDeviceGetPowerUsage(self, h: FakeGpu) -> int:
        while h.hang is not None and h.hang.is_set():
            h.hang.wait(0.01)  # NVML's own calls block in the driver; this one only until the test lets it go
        if h.power_mw is None:
            raise FakeNVMLError("Not Supported")
        return h.power_mw

    def nvmlDeviceGetClockInfo(self, h: FakeGpu, kind: int) -> int:
        assert kind == self.NVML_CLOCK_SM
        return 1980

    def nvmlDeviceGetTemperature(self, h: FakeGpu, kind: int) -> int:
        return 55

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: FakeGpu) -> int:
        return h.reasons

    def nvmlDeviceGetTotalEnergyConsumption(self, h: FakeGpu) -> int:
        if h.energy_mj is None:
            raise FakeNVMLError("Not Supported")
        return h.energy_mj


def test_nvml_lists_every_gpus_processes_and_a_missing_value_is_none() -> None:
    nv = FakeNvml([FakeGpu(UUID0, [(10, 3 * MIB), (11, None)]), FakeGpu(UUID1, [(12, 1 * MIB)])])
    p = NvmlProvider(nv)
    assert p.processes() == [ComputeProcess(UUID0, 10, 3 * MIB), ComputeProcess(UUID0, 11, None),
                             ComputeProcess(UUID1, 12, 1 * MIB)]
    p.close()
    assert nv.shut


def test_nvml_samples_in_the_same_units_as_nvidia_smi_and_unsupported_is_none() -> None:
    nv = FakeNvml([FakeGpu(UUID0, [], power_mw=None, reasons=0x40)])
    (s,) = NvmlProvider(nv).samples()
    assert (s.index, s.uuid, s.memory_used_bytes, s.memory_total_bytes) == (0, UUID0, 5 * MIB, 80 * MIB)
    assert (s.utilization_pct, s.sm_clock_mhz, s.temperature_c, s.power_w) == (42, 1980, 55, None)
    assert s.throttle_reasons == 0x40 and s.throttled


def test_nvml_that_cannot_start_is_unavailable_saying_why() -> None:
    with pytest.raises(GpuUnavailable, match="Driver Not Loaded"):
        NvmlProvider(FakeNvml([], init_fails=True))


def test_an_nvml_read_that_hangs_costs_that_read_only_and_the_next_fail_at_once_until_it_returns() -> None:
    """Issue 53 §6: NVML has no time limit, and a call into a GPU that fell off the bus can block
    for good. The provider waits for a read at most its timeout, on a thread of its own."""
    hang = threading.Event()
    gpu = FakeGpu(UUID0, [], hang=hang)
    p = NvmlProvider(FakeNvml([gpu]), timeout=0.2)
    hang.set()
    t0 = time.monotonic()
    with pytest.raises(GpuUnavailable, match=r"did not answer .* within 0\.2 s"):
        p.samples()
    with pytest.raises(GpuUnavailable, match="has not returned"):  # no pile of stuck threads: refused at once
        p.samples()
    assert time.monotonic() - t0 < 2
    hang.clear()
    wait_for(lambda: not [t for t in threading.enumerate() if t.name == "genready-nvml"], 5, "the stuck read back")
    assert p.samples()[0].power_w == 70.5  # it came back: read again


def test_a_sampler_whose_reads_hang_ends_with_the_run_and_says_why() -> None:
    hang = threading.Event()
    gpu = FakeGpu(UUID0, [], hang=hang)
    nv = FakeNvml([gpu])
    try:
        with Sampler(NvmlProvider(nv, timeout=0.3), interval=0.05, bound=0.5) as s:
            wait_for(lambda: len(s.timeline) >= 2, 5, "two samples")
            hang.set()
            wait_for(lambda: s.errors, 5, "a read that did not answer")
        t0 = time.monotonic()
        r = s.summary(output_tokens=100)
        assert time.monotonic() - t0 < 1 and r.errors >= 1 and "did not answer" in (r.error or ""), r
        assert r.to_json()["gpu_read_errors"] == r.errors and r.samples >= 2
    finally:
        hang.clear()


def test_a_sampler_ends_with_the_run_even_when_its_provider_never_returns() -> None:
    """Any provider (a future one, or one whose own bound failed): the run's end waits for a read
    in flight at most the sampler's bound, and never reads on the caller's thread."""
    release = threading.Event()

    class Stuck:
        name = "stuck"

        def processes(self) -> list[ComputeProcess]:
            return []

        def samples(self) -> list[GpuSample]:
            release.wait(30)
            return []

    try:
        t0 = time.monotonic()
        with Sampler(Stuck(), interval=0.05, bound=0.3) as s:
            pass
        r = s.summary(output_tokens=1)
        assert time.monotonic() - t0 < 2 and r.samples == 0 and r.errors == 1 and "within 0.3 s" in (r.error or "")
    finally:
        release.set()


def test_a_sample_that_fails_in_any_way_costs_that_sample_only() -> None:
    """Issue 53 §8: a value the provider cannot take (ValueError from int('nan'), say) raised out of
    the sampler at the run's end: the sweep died with no results line, its command still running."""
    calls = []

    class Odd:
        name = "odd"

        def processes(self) -> list[ComputeProcess]:
            return []

        def samples(self) -> list[GpuSample]:
            calls.append(1)
            if len(calls) > 1:
                raise ValueError("cannot convert float NaN to integer")
            return [sample(100.0, 1)]

    with Sampler(Odd(), interval=0.05) as s:
        wait_for(lambda: len(calls) >= 2, 5, "a failing read")
    r = s.summary(output_tokens=1)
    assert r.samples == 1 and r.errors >= 2 and r.error == "ValueError: cannot convert float NaN to integer", r


def test_the_watch_reads_the_provider_off_the_event_loop() -> None:
    nv = FakeNvml([FakeGpu(UUID0, [(os.getpid(), 2 * MIB)])])
    watch = GpuWatch(NvmlProvider(nv))
    me = Start("cafe" * 8, os.getpid(), 0.0)

    async def go() -> Any:
        return await watch.refresh([TargetStarts("t", "t.service", me)])

    reading = asyncio.run(go())
    assert threading.main_thread().name not in nv.threads and nv.threads, nv.threads
    assert reading.targets["t"].current_bytes == {UUID0: 2 * MIB}


# --- attribution (pure) ---------------------------------------------------------------------------

T0 = 1_000_000.0
FIRST, SECOND, THIRD = "1" * 32, "2" * 32, "3" * 32


def proc(pid: int, ppid: int = 1, at: float = T0, unit: str | None = "llm.service", cmd: str = "python3 -m sglang",
         cgroup: str | None = None) -> Proc:
    return Proc(pid, ppid, int(at * 100), at, tuple(cmd.split()),
                cgroup or (f"/system.slice/{unit}" if unit else "/user.slice"), unit)


def llm(current: Start | None = None) -> TargetStarts:
    earlier = (Start(FIRST, 100, T0, T0 + 60), Start(SECOND, 200, T0 + 61, T0 + 120))
    return TargetStarts("llm", "llm.service", current or Start(THIRD, 300, T0 + 121), earlier,
                        control_group="/system.slice/llm.service")


def one(p: Proc, *chain: Proc, t: TargetStarts | None = None, trees: Any = None) -> attribution.Holding:
    (h,) = attribute([ComputeProcess(UUID0, p.pid, 80 * MIB)], {p.pid: [p, *chain]}, [t or llm()], trees)
    return h


def test_the_main_pid_and_its_descendants_are_the_current_start() -> None:
    main = proc(300, at=T0 + 121)
    assert one(main).role == "current" and one(main).invocation_id == THIRD
    kid = proc(301, 300, at=T0 + 150)
    h = one(kid, main)
    assert (h.role, h.invocation_id, h.target) == ("current", THIRD, "llm")


def test_a_process_of_the_unit_begun_during_the_current_start_is_the_current_starts() -> None:
    h = one(proc(310, 1, at=T0 + 130))
    assert h.role == "current"


def test_a_start_without_its_main_pid_yet_still_owns_what_its_cgroup_began_since() -> None:
    """ExecStartPre= (a weights download, a GPU check) runs before there is a MainPID."""
    h = one(proc(305, 1, at=T0 + 122), t=llm(Start(THIRD, 0, T0 + 121)))
    assert (h.role, h.invocation_id) == ("current", THIRD)


def test_a_process_of_the_unit_begun_during_an_earlier_start_is_that_starts_stray() -> None:
    h = one(proc(150, 1, at=T0 + 62))
    assert (h.role, h.invocation_id) == ("stray", SECOND)
    assert "llm.service's cgroup" in h.why
    h = one(proc(110, 1, at=T0 + 5))
    assert (h.role, h.invocation_id) == ("stray", FIRST)


def test_a_process_of_the_unit_older_than_every_record_is_a_stray_of_an_unknown_start() -> None:
    h = one(proc(50, 1, at=T0 - 100))
    assert (h.role, h.invocation_id) == ("stray", None) and "no record" in h.why


def test_a_target_whose_only_start_is_the_current_one_does_not_stop_the_others_strays_being_found() -> None:
    """Found by the daemon's status page test: a target with one (current) start and no earlier one
    made every read fail (zip of no earlier starts against the current one's beginning)."""
    fresh = TargetStarts("sim", "sim.service", Start(FIRST, 500, T0), (), control_group="/system.slice/sim.service")
    stopped = TargetStarts("llm", "llm.service", None, (Start(SECOND, 100, T0, T0 + 60),),
                           control_group="/system.slice/llm.service")
    (h,) = attribute([ComputeProcess(UUID0, 150, MIB)], {150: [proc(150, at=T0 + 1)]}, [fresh, stopped])
    assert (h.role, h.target, h.invocation_id) == ("stray", "llm", SECOND)


def test_a_process_of_a_stopped_unit_is_a_stray() -> None:
    t = TargetStarts("llm", "llm.service", None, (Start(FIRST, 100, T0, T0 + 60),),
                     control_group="/system.slice/llm.service")
    h = attribute([ComputeProcess(UUID0, 150, MIB)], {150: [proc(150, at=T0 + 1)]}, [t])[0]
    assert (h.role, h.invocation_id) == ("stray", FIRST)


def test_an_escaped_process_recorded_in_an_earlier_tree_is_that_starts_stray() -> None:
    p = proc(4242, 1, at=T0 + 70, unit=None)
    h = one(p, trees={(4242, p.start_ticks): ("llm", SECOND)})
    assert (h.role, h.invocation_id, h.why) == ("stray", SECOND, "recorded in that start's process tree")
    # the same PID, another process (reused): not that start's
    other = proc(4242, 1, at=T0 + 200, unit=None)
    assert one(other, trees={(4242, p.start_ticks): ("llm", SECOND)}).role == "other"


def test_an_escaped_process_recorded_in_the_current_tree_is_the_current_starts() -> None:
    p = proc(4245, 1, at=T0 + 130, unit=None)
    h = one(p, trees={(4245, p.start_ticks): ("llm", THIRD)})
    assert (h.role, h.invocation_id) == ("current", THIRD)


def test_an_escaped_process_whose_parent_chain_leads_to_an_earlier_main_pid_is_a_stray() -> None:
    old_main = proc(200, 1, at=T0 + 61, unit=None)
    h = one(proc(4243, 200, at=T0 + 70, unit=None), old_main)
    assert (h.role, h.invocation_id) == ("stray", SECOND) and "MainPID 200" in h.why


def test_an_escaped_process_naming_an_earlier_main_pid_on_its_command_line_is_a_stray() -> None:
    h = one(proc(4244, 1, at=T0 + 5, unit=None, cmd="python3 -m sglang.scheduler --parent-pid 100"))
    assert (h.role, h.invocation_id) == ("stray", FIRST)
    # ... but not if it began after that start ended: the PID named may be another process by then
    assert one(proc(4244, 1, at=T0 + 200, unit=None, cmd="x --parent-pid 100")).role == "other"


def test_processes_of_other_units_or_none_are_others_and_gone_ones_unknown() -> None:
    h = one(proc(77, 1, unit="other.service"))
    assert (h.role, h.target, h.unit) == ("other", None, "other.service")
    (gone,) = attribute([ComputeProcess(UUID0, 99, MIB)], {}, [llm()])
    assert gone.role == "unknown"


def test_control_group_is_matched_exactly_when_given() -> None:
    """Two managers on one host may each have an llm.service: the ControlGroup tells them apart."""
    t = TargetStarts("llm", "llm.service", Start(THIRD, 300, T0 + 121), (Start(SECOND, 200, T0 + 61, T0 + 120),),
                     control_group="/um-1/app.slice/llm.service")
    mine = proc(150, at=T0 + 62, cgroup="/um-1/app.slice/llm.service/sub")
    theirs = proc(151, at=T0 + 62, cgroup="/um-2/app.slice/llm.service")
    assert one(mine, t=t).role == "stray" and one(theirs, t=t).role == "other"


def test_a_unit_of_the_targets_name_elsewhere_is_never_the_targets() -> None:
    """Issue 53 §5: with the unit's ControlGroup not known, a process whose innermost unit has the
    target unit's name is not taken for the target's by that name (before: counted as the current
    start's memory, or a stray whose `kill` the sweep suggested); the MainPID and the recorded
    trees still tie processes to it."""
    t = dataclasses.replace(llm(), control_group=None)
    during, before = proc(150, at=T0 + 130), proc(151, at=T0 + 62)
    assert (one(during, t=t).role, one(before, t=t).role) == ("other", "other")
    assert one(proc(300, at=T0 + 121), t=t).role == "current"
    assert one(before, t=t, trees={(151, before.start_ticks): ("llm", SECOND)}).role == "stray"
    # Known, it is matched exactly: a prefix of another path is not a parent of it.
    assert one(proc(152, at=T0 + 62, cgroup="/system.slice/llm.service-2"), t=llm()).role == "other"


def test_the_command_shown_is_redacted_and_escaped() -> None:
    h = one(proc(150, at=T0 + 62, cmd="server\x1b[31m --api-key sk-secret123"))
    assert "sk-secret123" not in h.command and "\x1b" not in h.command and "\\x1b" in h.command


def test_per_target_sums_current_memory_and_strays_per_gpu() -> None:
    hs = attribute([ComputeProcess(UUID0, 300, 10 * MIB), ComputeProcess(UUID1, 300, 10 * MIB),
                    ComputeProcess(UUID0, 150, 70 * MIB), ComputeProcess(UUID1, 150, 5 * MIB)],
                   {300: [proc(300, at=T0 + 121)], 150: [proc(150, at=T0 + 62)]}, [llm()])
    tg = per_target(hs, ["llm", "idle"])
    assert tg["llm"].current_bytes == {UUID0: 10 * MIB, UUID1: 10 * MIB}
    assert tg["llm"].stray_bytes() == {UUID0: 70 * MIB, UUID1: 5 * MIB}
    assert [h.invocation_id for h in tg["llm"].strays] == [SECOND, SECOND]
    assert tg["idle"].to_json() == {"current_bytes": {}, "strays": [], "stray_bytes": {}}


def test_starts_of_builds_the_starts_from_genready_records() -> None:
    def rec(inv: str, pid: int, start: float, end: float | None) -> StartRecord:
        return StartRecord("llm", "llm.service", inv, pid, iso(start), iso(start), iso(end) if end else None,
                           None, None, None, 0)

    t = starts_of("llm", "llm.service", [rec(FIRST, 100, T0, T0 + 60), rec(SECOND, 200, T0 + 61, None)], SECOND)
    assert t.current == Start(SECOND, 200, T0 + 61, None)
    assert t.earlier == (Start(FIRST, 100, T0, T0 + 60),)


# --- /proc ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,unit,path", [
    ("12:name=systemd:/system.slice/llm.service\n0::/system.slice/llm.service\n", "llm.service",
     "/system.slice/llm.service"),
    ("0::/system.slice/llm.service/payload\n", "llm.service", "/system.slice/llm.service/payload"),
    ("9:name=systemd:/um-1/app.slice/llm.service\n4:memory:/x\n0::/\n", "llm.service", "/um-1/app.slice/llm.service"),
    ("0::/user.slice/user-0.slice/session-3.scope\n", "session-3.scope", "/user.slice/user-0.slice/session-3.scope"),
    ("0::/escaped\n", None, "/escaped"),
])
def test_unit_of_cgroup_reads_v2_then_v1(text: str, unit: str | None, path: str) -> None:
    assert unit_of_cgroup(text) == (unit, path)


def test_read_proc_reads_this_process() -> None:
    p = read_proc(os.getpid())
    assert p is not None and p.ppid == os.getppid() and p.cmdline
    assert p.started_at is not None and p.started_at <= __import__("time").time()
    assert read_proc(2**22 + 7) is None  # above pid_max: never a process


def test_choose_falls_back_to_nvidia_smi_and_says_why_neither_would_do(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "pynvml", None)  # an import of it fails, as without the extra
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(GpuUnavailable, match=r"nvml: nvidia-ml-py is not installed.*nvidia-smi: no nvidia-smi on PATH"):
        choose()
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\n")
    smi.chmod(0o755)
    p = choose()
    assert isinstance(p, SmiProvider) and p.path == str(smi)
    with pytest.raises(GpuUnavailable, match="unknown provider 'amd'"):
        choose("amd")


def test_the_gauges_show_each_targets_stray_and_current_bytes_per_gpu() -> None:
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from genready.gpu.gauge import GpuCollector
    from genready.gpu.watch import GpuReading

    def scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        text = generate_latest(reg).decode()
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for fam in text_string_to_metric_families(text) for s in fam.samples}

    latest: list[GpuReading | None] = [None]
    reg = CollectorRegistry()
    reg.register(GpuCollector(lambda: latest[0]))
    assert scrape() == {}  # no reading yet: no series
    procs = [ComputeProcess(UUID0, 300, 10 * MIB), ComputeProcess(UUID0, 150, 70 * MIB)]
    holdings = attribute(procs, {300: [proc(300, at=T0 + 121)], 150: [proc(150, at=T0 + 62)]}, [llm()])
    latest[0] = GpuReading(T0, holdings, per_target(holdings, ["llm"]))
    labels = (("gpu", UUID0), ("target", "llm"))
    assert scrape() == {("genready_gpu_stray_bytes", labels): 70 * MIB,
                        ("genready_gpu_current_bytes", labels): 10 * MIB, ("genready_gpu_read_ok", ()): 1}
    latest[0] = GpuReading(T0, error="nvidia-smi exited 9")
    assert scrape() == {("genready_gpu_read_ok", ()): 0}


# --- a run's GPU cost -----------------------------------------------------------------------------

def sample(power: float | None, used_mib: int, reasons: int | None = 1, index: int = 0) -> GpuSample:
    return GpuSample(index, UUID0 if index == 0 else UUID1, used_mib * MIB, 143771 * MIB, 50.0, power, 1980.0, 60.0,
                     reasons)


def test_a_runs_energy_is_power_integrated_over_time_and_gives_tokens_per_joule() -> None:
    timeline = [(0.0, [sample(100.0, 10), sample(100.0, 10, index=1)]),
                (1.0, [sample(300.0, 50), sample(100.0, 10, index=1)]),
                (3.0, [sample(300.0, 20), sample(100.0, 10, index=1)])]
    r = summarise(timeline, output_tokens=1200)
    # all GPUs: 200 W, 400 W, 400 W; trapezoids: 1 s × 300 W + 2 s × 400 W = 1100 J over 3 s
    assert (r.energy_j, r.mean_power_w, r.seconds) == (1100.0, 1100.0 / 3, 3.0)
    assert r.tokens_per_joule == 1200 / 1100
    assert r.peak_memory_bytes == 60 * MIB and not r.throttled and r.samples == 3 and r.energy_from == "power"


def test_a_run_with_a_reason_other_than_idle_is_throttled() -> None:
    r = summarise([(0.0, [sample(100.0, 1)]), (1.0, [sample(700.0, 1, reasons=0x4 | 0x1)])], output_tokens=None)
    assert r.throttled and r.throttle_reasons == 0x5 and r.tokens_per_joule is None
    assert r.to_json()["throttle_reasons"] == "0x5"


def test_without_power_readings_there_is_no_energy() -> None:
    r = summarise([(0.0, [sample(None, 1)]), (1.0, [sample(None, 2)])], output_tokens=10)
    assert (r.energy_j, r.mean_power_w, r.tokens_per_joule, r.peak_memory_bytes) == (None, None, None, 2 * MIB)


def counters(*mj: tuple[float, int | None], power: float | None = 100.0) -> list[tuple[float, list[GpuSample]]]:
    return [(t, [dataclasses.replace(sample(power, 1), energy_mj=e)]) for t, e in mj]


def test_an_energy_counter_that_restarts_gives_energy_from_power_and_says_why() -> None:
    """Issue 53 §12: a counter that went down between two samples (a driver reload, a GPU reset)
    gave a negative energy, mean power and tokens per joule."""
    for timeline in (counters((0.0, 5_000_000), (1.0, 5_300_000), (2.0, 200_000)),
                     counters((0.0, 5_000_000), (1.0, 100_000), (2.0, 5_500_000))):  # back past its start
        r = summarise(timeline, output_tokens=400)
        assert (r.energy_j, r.mean_power_w, r.tokens_per_joule, r.energy_from) == (200.0, 100.0, 2.0, "power"), r
        assert "went down" in (r.energy_note or "") and UUID0 in (r.energy_note or ""), r
        assert r.to_json()["energy_note"] == r.energy_note
    r = summarise(counters((0.0, 5_000_000), (1.0, 100_000), power=None), output_tokens=400)
    assert (r.energy_j, r.mean_power_w, r.tokens_per_joule, r.energy_from) == (None, None, None, None), r
    assert "went down" in (r.energy_note or "") and "no power" in (r.energy_note or ""), r


def test_no_energy_has_no_source_and_a_nan_power_is_no_reading() -> None:
    """Issue 53 §13: energy from NaN powers was NaN (null in the results line) with energy_from "power"."""
    nan = float("nan")
    r = summarise([(0.0, [sample(nan, 1)]), (1.0, [sample(nan, 1)])], output_tokens=10)
    assert (r.energy_j, r.mean_power_w, r.energy_from) == (None, None, None)
    assert r.to_json()["energy_from"] is None and r.to_json()["energy_j"] is None
    r = summarise([(0.0, [sample(nan, 1)]), (1.0, [sample(100.0, 1)]), (2.0, [sample(100.0, 1)])], output_tokens=10)
    assert (r.energy_j, r.energy_from) == (100.0, "power")


def test_the_sampler_samples_on_its_own_thread_from_start_to_end() -> None:
    nv = FakeNvml([FakeGpu(UUID0, [])])
    with Sampler(NvmlProvider(nv), interval=0.01) as s:
        wait_for(lambda: len(s.timeline) >= 3, 5, "three samples")
    assert nv.threads == {"genready-nvml"}  # each read bounded, on a thread of its own (never the caller's)
    r = s.summary(output_tokens=100)
    assert r.samples >= 4 and r.mean_power_w == 70.5 and r.energy_j is not None and r.energy_j > 0


def test_a_stray_is_said_in_one_line_with_how_to_end_it() -> None:
    procs = [ComputeProcess(UUID0, 150, 70 * 2**30), ComputeProcess(UUID1, 151, 0), ComputeProcess(UUID1, 300, MIB)]
    chains = {150: [proc(150, at=T0 + 62, cmd="sglang::scheduler")], 151: [proc(151, at=T0 + 62)],
              300: [proc(300, at=T0 + 121)]}
    holdings = attribute(procs, chains, [llm()])
    reading = GpuReading(T0, holdings, per_target(holdings, ["llm"]))
    assert 300 not in [h.pid for h in reading.targets["llm"].strays]  # the current start's
    (h,) = [h for h in reading.targets["llm"].strays if h.pid == 150]
    assert stray_line(h) == (
        f"{UUID0} holds 70.0 GiB in PID 150 (sglang::scheduler), in llm.service's cgroup, left by the start "
        f"{SECOND[:12]}; end it with `kill 150`")


def test_energy_comes_from_the_gpus_counters_where_nvml_has_them() -> None:
    def at(t: float, mj: int) -> tuple[float, list[GpuSample]]:
        return t, [dataclasses.replace(sample(100.0, 1), energy_mj=mj),
                   dataclasses.replace(sample(100.0, 1, index=1), energy_mj=2 * mj)]

    r = summarise([at(0.0, 1_000_000), at(1.0, 1_300_000), at(2.0, 1_500_000)], output_tokens=900)
    # counters: GPU0 +500 J, GPU1 +1000 J (the sampled 200 W would have said 400 J)
    assert (r.energy_j, r.mean_power_w, r.tokens_per_joule, r.energy_from) == (1500.0, 750.0, 900 / 1500, "counter")
    nv = FakeNvml([FakeGpu(UUID0, [], energy_mj=123_456)])
    assert NvmlProvider(nv).samples()[0].energy_mj == 123_456
