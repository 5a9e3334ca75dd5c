"""On a GPU host: do genready's two GPU providers (NVML through nvidia-ml-py, and nvidia-smi) agree on
the compute processes and their memory, and what does one sample of each GPU look like?

    PYTHONPATH=daemon python3 bench/gpu_check.py [--hold-mib N] [--raw] [--json FILE] [--smi PATH]

Standard library only (nvidia-ml-py is used when importable, else the check says NVML was
unavailable and runs nvidia-smi alone); no venv: with PYTHONPATH=daemon it runs from a bare
checkout (the product's gpu/ package needs nothing outside the standard library).
`--hold-mib N` first starts a process that allocates N MiB on GPU 0 (through PyTorch or CuPy,
if either is installed) so that there is a known process to find: it must appear in both
providers' lists with at least N MiB, under its own PID. Exit 0: agreed; 1: they disagree (or the
held process is missing); 2: no provider could read.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

try:
    from genready.gpu.attribution import read_proc
    from genready.gpu.provider import MIB, ComputeProcess, GpuSample, GpuUnavailable, Provider
    from genready.gpu.sampling import Sampler
    from genready.gpu.smi import APPS_FIELDS, FORMAT, GPU_FIELDS, SmiProvider, run_bounded
except ImportError:
    sys.exit("genready is not importable: install it, or run from the checkout with "
             "PYTHONPATH=daemon python3 bench/gpu_check.py")

HOLDER = """
import sys
n = int(sys.argv[1]) * 1024 * 1024
try:
    import torch
    x = torch.empty(n, dtype=torch.uint8, device="cuda:0"); x.fill_(1); torch.cuda.synchronize(); how = "torch"
except ImportError:
    import cupy
    x = cupy.ones(n, dtype=cupy.uint8); cupy.cuda.Device(0).synchronize(); how = "cupy"
print("ready", how, flush=True)
sys.stdin.read()
"""
# Work for the sampler to measure: bf16 8192³ products on GPU 0 for argv[1] seconds; prints how many.
BUSY = """
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda:0", dtype=torch.bfloat16); b = torch.randn_like(a)
(a @ b); torch.cuda.synchronize()
print("ready", flush=True)
end, n = time.time() + float(sys.argv[1]), 0
while time.time() < end:
    for _ in range(10):
        c = a @ b
    torch.cuda.synchronize(); n += 10
print(n, flush=True)
"""


def providers(smi_path: str | None) -> tuple[list[Provider], list[str]]:
    from genready.gpu.nvml import NvmlProvider

    got: list[Provider] = []
    missing = []
    for make in (NvmlProvider, lambda: SmiProvider(smi_path)):
        try:
            got.append(make())
        except GpuUnavailable as e:
            missing.append(str(e))
    return got, missing


def timed(call: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = call()
    return out, (time.perf_counter() - t0) * 1000


def hold(mib: int) -> tuple[subprocess.Popen[str] | None, str]:
    """A child holding `mib` MiB on GPU 0, ready; (None, why) if it could not."""
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(mib)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None
    line = p.stdout.readline()  # blocks until it allocated, or exited
    if not line.startswith("ready"):
        p.kill()
        err = (p.stderr.read() if p.stderr else "")[-400:]
        return None, f"holder failed: {line.strip()} {err.strip()}"
    return p, line.split()[1]


def load_run(provider: Provider, seconds: float) -> dict[str, Any]:
    """Sample the GPUs every 0.5 s while BUSY runs for `seconds`; the run's figures, with the
    driver's own energy counter beside the sampled energy where NVML has one."""
    p = subprocess.Popen([sys.executable, "-c", BUSY, str(seconds)], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    if p.stdout.readline().strip() != "ready":
        p.kill()
        return {"error": "the load could not start"}
    nv = getattr(provider, "nv", None)
    handle = nv.nvmlDeviceGetHandleByIndex(0) if nv is not None else None
    e0 = nv.nvmlDeviceGetTotalEnergyConsumption(handle) if nv is not None else None
    with Sampler(provider, interval=0.5) as sampler:
        products = int(p.stdout.readline() or 0)
    e1 = nv.nvmlDeviceGetTotalEnergyConsumption(handle) if nv is not None else None
    p.wait()
    summary = sampler.summary(products)
    run = summary.to_json()
    run["products"] = products
    run["tflops"] = round(products * 2 * 8192**3 / max(summary.seconds, 1e-9) / 1e12, 1)
    if e0 is not None and e1 is not None:
        run["nvml_energy_counter_j"] = (e1 - e0) / 1000  # the counter is in mJ
    return run


def by_key(procs: list[ComputeProcess]) -> dict[tuple[str, int], int | None]:
    return {(p.gpu_uuid, p.pid): p.used_bytes for p in procs}


def sample_text(s: GpuSample) -> str:
    def f(v: float | None, unit: str, scale: float = 1.0) -> str:
        return "n/a" if v is None else f"{v / scale:.1f}{unit}"
    mask = "n/a" if s.throttle_reasons is None else f"{s.throttle_reasons:#x}"
    return (f"gpu {s.index} {s.uuid}: mem {f(s.memory_used_bytes, ' MiB', MIB)}/{f(s.memory_total_bytes, ' MiB', MIB)}"
            f" util {f(s.utilization_pct, '%')} power {f(s.power_w, ' W')} sm {f(s.sm_clock_mhz, ' MHz')}"
            f" temp {f(s.temperature_c, ' C')} reasons {mask}{' (throttled)' if s.throttled else ''}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hold-mib", type=int, default=0, help="first start a process holding this much on GPU 0")
    ap.add_argument("--json", type=Path, help="also write the findings here")
    ap.add_argument("--smi", help="the nvidia-smi to run (default: the one on PATH)")
    ap.add_argument("--raw", action="store_true", help="also print nvidia-smi's own CSV for both queries")
    ap.add_argument("--load-seconds", type=float, default=0,
                    help="then sample a run of bf16 matrix products this long (PyTorch): power, energy, throttling")
    args = ap.parse_args()
    report: dict[str, Any] = {"ok": True, "problems": []}
    problems: list[str] = report["problems"]
    got, missing = providers(args.smi)
    report["providers"] = [p.name for p in got]
    report["unavailable"] = missing
    for why in missing:
        print(f"unavailable: {why}")
    if not got:
        print("no provider can read the GPUs here")
        return 2
    holder, how = (None, "")
    if args.hold_mib:
        holder, how = hold(args.hold_mib)
        print(f"holder: pid {holder.pid} holds {args.hold_mib} MiB on GPU 0 through {how}" if holder else how)
        report["holder"] = {"pid": holder.pid if holder else None, "mib": args.hold_mib, "how": how}
        if holder is None:
            problems.append(how)
    try:
        lists: dict[str, dict[tuple[str, int], int | None]] = {}
        for p in got:
            procs, ms = timed(p.processes)
            samples, ms2 = timed(p.samples)
            lists[p.name] = by_key(procs)
            print(f"\n[{p.name}] processes() {ms:.1f} ms, samples() {ms2:.1f} ms")
            for s in samples:
                print("  " + sample_text(s))
            if args.raw and isinstance(p, SmiProvider):
                for q in (f"--query-compute-apps={','.join(APPS_FIELDS)}",
                          f"--query-gpu={','.join(GPU_FIELDS)},{p._throttle_field}"):
                    rc, out, err = run_bounded([p.path, q, FORMAT])
                    print(f"  $ nvidia-smi {q} {FORMAT}  (exit {rc})\n" + "".join(
                        f"  | {line}\n" for line in (out + err).splitlines()))
            for (uuid, pid), used in sorted(lists[p.name].items()):
                proc = read_proc(pid)
                who = "not in this PID namespace" if proc is None else f"unit {proc.unit}, cgroup {proc.cgroup}, " \
                      f"cmd {' '.join(proc.cmdline)[:80]!r}"
                print(f"  pid {pid} on {uuid}: {'n/a' if used is None else used // MIB} MiB; {who}")
            report[p.name] = {"ms_processes": round(ms, 2), "ms_samples": round(ms2, 2),
                              "processes": [[u, pid, b] for (u, pid), b in sorted(lists[p.name].items())],
                              "samples": [dataclasses.asdict(s) for s in samples]}
        if len(lists) == 2:
            (na, a), (nb, b) = lists.items()
            if set(a) != set(b):
                problems.append(f"{na} lists {sorted(set(a) - set(b))} that {nb} does not; "
                                f"{nb} lists {sorted(set(b) - set(a))} that {na} does not")
            for key in set(a) & set(b):
                x, y = a[key], b[key]
                # nvidia-smi gives whole MiB; NVML bytes
                if (x is None) != (y is None) or (x is not None and y is not None and abs(x - y) > MIB):
                    problems.append(f"{key}: {na} says {x} bytes, {nb} says {y}")
            print(f"\nagreement: {len(set(a) & set(b))} processes in both, "
                  f"{len(set(a) ^ set(b))} in one only")
        else:
            print(f"\nonly {', '.join(lists)} could read: nothing to compare it with")
        if holder is not None:
            for name, procs in lists.items():
                mine = {k: v for k, v in procs.items() if k[1] == holder.pid}
                if not mine:
                    problems.append(f"{name} does not list the holder's pid {holder.pid} "
                                    f"(listed: {sorted(k[1] for k in procs)})")
                elif any(v is not None and v < args.hold_mib * MIB for v in mine.values()):
                    problems.append(f"{name} lists the holder with less than {args.hold_mib} MiB: {mine}")
        if args.load_seconds:
            for p in got:
                run = load_run(p, args.load_seconds)
                report[f"load_{p.name}"] = run
                if "error" in run:
                    problems.append(f"{p.name}: {run['error']}")
                print(f"\n[{p.name}] a {args.load_seconds:g} s load, sampled every 0.5 s: {json.dumps(run)}")
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
    report["ok"] = not problems
    for problem in problems:
        print(f"PROBLEM: {problem}")
    print(("\nOK: the providers agree" if len(got) == 2 else "\nOK (one provider)") if not problems else "\nFAILED")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str))
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
