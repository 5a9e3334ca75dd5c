"""A sweep's GPU cost against a driver that misbehaves (issue 53 §6, §8, §13): whole sweeps on the
simulator unit of tests/test_sweep.py's Rig (the private systemd manager, a real genready daemon),
the sweep reading its GPUs through
- the stand-in `nvidia-smi` (genready_dev/nvidia_smi.py: a real executable printing NVIDIA's CSV)
  that prints `nan` where a number is due, or
- a stand-in of `pynvml` on PYTHONPATH whose power read blocks while a file exists (a GPU that fell
  off the bus). NVML is a C library talking to a GPU driver; these machines have neither, so this
  module (written per test, below) is the only way to run the NVML provider in a sweep here.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from genready.systemd import sweepdropin
from genready_dev import nvidia_smi
from genready_dev.harness import wait_for
from genready_dev.usermanager import UserManager
from tests.test_sweep import UNIT, Rig

pytestmark = pytest.mark.system

GPU0 = "GPU-8a4c5e1f-0b7e-2d3c-9f61-5b2e7d3a9c10"

# The calls genready.gpu.nvml makes, as nvidia-ml-py names them; the power read blocks while the
# file named by $FAKE_NVML_HANG exists.
FAKE_PYNVML = '''
import os, time
from types import SimpleNamespace

class NVMLError(Exception):
    pass

NVML_CLOCK_SM = 1
NVML_TEMPERATURE_GPU = 0
nvmlMemory_v2 = 0x02000028
GPU = object()

def nvmlInit(): pass
def nvmlShutdown(): pass
def nvmlDeviceGetCount(): return 1
def nvmlDeviceGetHandleByIndex(i): return GPU
def nvmlDeviceGetUUID(h): return "GPU0"
def nvmlDeviceGetComputeRunningProcesses(h): return []
def nvmlDeviceGetMemoryInfo(h, version=None): return SimpleNamespace(used=1 << 30, total=80 << 30, free=79 << 30)
def nvmlDeviceGetUtilizationRates(h): return SimpleNamespace(gpu=50, memory=5)
def nvmlDeviceGetClockInfo(h, kind): return 1980
def nvmlDeviceGetTemperature(h, kind): return 55
def nvmlDeviceGetCurrentClocksThrottleReasons(h): return 1
def nvmlDeviceGetTotalEnergyConsumption(h): return int(time.monotonic() * 100000)

def nvmlDeviceGetPowerUsage(h):
    while os.path.exists(os.environ["FAKE_NVML_HANG"]):
        time.sleep(0.05)
    return 100000
'''.replace("GPU0", GPU0)


@pytest.fixture
def rig(manager: UserManager, tmp_path: Path) -> Iterator[Rig]:
    r = Rig(manager, tmp_path)
    try:
        yield r
    finally:
        # A sweep that hung (the bug) left its drop-in: remove it, so the next test finds the unit as it was.
        dropin = Path(manager.env["XDG_RUNTIME_DIR"]) / "systemd" / "user" / f"{UNIT}.d" / sweepdropin.DROPIN_NAME
        if dropin.exists():
            dropin.unlink()
            manager.systemctl("daemon-reload")
        r.close()


def nvml_env(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """The sweep's environment with the stand-in pynvml first on its path; the file that makes it hang."""
    lib = tmp_path / "fakenvml"
    lib.mkdir()
    (lib / "pynvml.py").write_text(FAKE_PYNVML)
    hang = tmp_path / "hang"
    path = os.pathsep.join(filter(None, [str(lib), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": path, "FAKE_NVML_HANG": str(hang)}, hang


def finish(p: Any, within: float) -> int | None:
    """p's exit status once it exits within `within` s; None if it does not (it is then killed)."""
    try:
        p.communicate(timeout=within)
    except Exception:
        p.kill()
        p.communicate(timeout=10)
        return None
    return int(p.returncode)


def test_a_gpu_read_that_hangs_costs_the_run_its_gpu_figures_only(rig: Rig, tmp_path: Path) -> None:
    """Before: the sweep hung after the point's command ended: no results line, the drop-in left."""
    env, hang = nvml_env(tmp_path)
    hang.touch()  # every power read blocks, from the run's first sample on
    p = rig.sweep(rig.write_plan(points=[{"n": 1, "budget": 8, "topk": 1}]), env=env)
    t0 = time.monotonic()
    rc = finish(p, 40)
    err = rig.err.read_text()
    assert rc == 0, (rc, err)
    assert time.monotonic() - t0 < 30, err
    (line,) = rig.results_lines()
    assert line["status"] == "ok" and line["gpu_samples"] == 0 and line["gpu_read_errors"] >= 1, line
    assert "NVML did not answer" in line["gpu_read_error"], line
    assert line["energy_j"] is None and line["energy_from"] is None and line["tokens_per_joule"] is None, line
    rig.assert_restored()


def test_sigterm_ends_a_sweep_whose_gpu_read_hangs_promptly(rig: Rig, tmp_path: Path) -> None:
    """Before: SIGTERM did not end it at all (the read ran on the sweep's own thread)."""
    env, hang = nvml_env(tmp_path)
    hang.touch()
    p = rig.sweep(rig.write_plan(points=[{"n": 1, "budget": 8, "topk": 1}], mode="block-at-1"), env=env)
    wait_for(lambda: (rig.tmp / "marker").exists() or p.poll() is not None, 60, "the command running")
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    rc = finish(p, 20)
    err = rig.err.read_text()
    assert rc == 130, (rc, err)
    assert time.monotonic() - t0 < 15, err
    (line,) = rig.results_lines()
    assert line["status"] == "invalidated" and "interrupted" in line["reason"], line
    rig.assert_restored()


def test_nan_from_nvidia_smi_is_null_and_gpu_json_is_strict(rig: Rig, tmp_path: Path) -> None:
    """Before: `nan` in an integer field raised out of the sampler once the command had started (the
    sweep died with no results line); `nan` power was a bare NaN in gpu.json, and energy_from said
    "power" for the null energy."""
    state = tmp_path / "smi.json"
    nvidia_smi.install(tmp_path / "bin", state)
    nan = float("nan")
    nvidia_smi.write_state(state, {"gpus": [
        {"index": nan, "uuid": GPU0, "memory_used_mib": nan, "memory_total_mib": 143771, "utilization_pct": nan,
         "power_w": nan, "sm_clock_mhz": "[Not Supported]", "temperature_c": 31, "throttle": "0x0000000000000001"}],
        "apps": []})
    env = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    rc, out = rig.run(rig.write_plan(points=[{"n": 1, "budget": 8, "topk": 1}]), env=env)
    assert rc == 0, (out, rig.err.read_text())
    (line,) = rig.results_lines()
    assert line["status"] == "ok" and line["gpu_samples"] >= 2 and line["gpu_read_errors"] == 0, line
    assert (line["energy_j"], line["energy_from"], line["mean_power_w"], line["peak_gpu_memory_bytes"]) == (
        None, None, None, None), line

    def strict(token: str) -> None:
        raise AssertionError(f"{token} in gpu.json")
    doc = json.loads((rig.results / line["out"] / "gpu.json").read_text(), parse_constant=strict)
    g = doc["samples"][0]["gpus"][0]
    assert (g["index"], g["memory_used_bytes"], g["power_w"], g["sm_clock_mhz"]) == (0, None, None, None), g
    assert doc["summary"]["energy_from"] is None
    rig.assert_restored()
