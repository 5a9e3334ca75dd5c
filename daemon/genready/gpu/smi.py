"""The nvidia-smi provider: its CSV queries, run bounded in time and size, and their parsers.

The queries and their fields are NVIDIA's documented ones (`nvidia-smi --help-query-compute-apps`,
`--help-query-gpu`; the manual page, e.g. https://manpages.ubuntu.com/manpages/noble/man1/nvidia-smi.1.html,
"SELECTIVE QUERY OPTIONS"). With `--format=csv,noheader,nounits` each line is the fields in the
order asked, separated by ", ", memory in MiB, power in W, clocks in MHz, temperature in °C, the
clock-event (throttle) reasons as a hex bitmask (`0x0000000000000004`), and a value the driver does
not have as `[N/A]`, `[Not Supported]` or similar. Drivers from 535 on call the reasons
`clocks_event_reasons.*`, keeping `clocks_throttle_reasons.*` as the old name; older ones know only
the old name, so the old name is asked first and the new one if it is refused.
"""

from __future__ import annotations

import csv
import math
import os
import selectors
import shutil
import subprocess
import time
from collections.abc import Sequence
from typing import Final

from genready.gpu.provider import MIB, READ_TIMEOUT_S, ComputeProcess, GpuSample, GpuUnavailable

APPS_FIELDS: Final = ("gpu_uuid", "pid", "used_memory")
GPU_FIELDS: Final = ("index", "uuid", "memory.used", "memory.total", "utilization.gpu", "power.draw",
                     "clocks.sm", "temperature.gpu")
THROTTLE_FIELDS: Final = ("clocks_throttle_reasons.active", "clocks_event_reasons.active")
FORMAT: Final = "--format=csv,noheader,nounits"
# A line per process or GPU is well under 200 bytes: 1 MiB is thousands of them, and a broken or
# hostile nvidia-smi cannot make genready hold more.
OUTPUT_CAP: Final = 1 << 20


def run_bounded(argv: Sequence[str], timeout: float = READ_TIMEOUT_S, cap: int = OUTPUT_CAP) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of argv, killed past `timeout` seconds or `cap` bytes of output
    in all (GpuUnavailable then, saying which). stderr is kept apart: a driver warning printed
    there must not become a line of the CSV."""
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as e:
        raise GpuUnavailable(f"cannot run {argv[0]}: {e.strerror or e}") from e
    assert proc.stdout is not None and proc.stderr is not None
    fd_out, fd_err = proc.stdout.fileno(), proc.stderr.fileno()
    got = {fd_out: bytearray(), fd_err: bytearray()}
    deadline = time.monotonic() + timeout
    why = ""
    with proc, selectors.DefaultSelector() as sel:
        for f in (proc.stdout, proc.stderr):
            sel.register(f, selectors.EVENT_READ)
        while sel.get_map() and not why:
            left = deadline - time.monotonic()
            if left <= 0:
                why = f"{argv[0]} gave no complete answer within {timeout:g} s"
                break
            for key, _ in sel.select(left):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                got[key.fd] += chunk
                if sum(map(len, got.values())) > cap:
                    why = f"{argv[0]} wrote more than {cap} bytes"
        if not why:
            try:
                rc = proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                why = f"{argv[0]} did not exit within {timeout:g} s"
        if why:
            proc.kill()
            proc.wait()
            raise GpuUnavailable(why)
    return rc, got[fd_out].decode("utf-8", errors="replace"), got[fd_err].decode("utf-8", errors="replace")


def _missing(value: str) -> bool:
    """`[N/A]`, `[Not Supported]`, `[Insufficient Permissions]`, `N/A`, empty: the driver has no value."""
    v = value.strip()
    return not v or v.startswith("[") or v.upper() == "N/A"


def _num(value: str, what: str) -> float | None:
    """The number, or None where the driver has none: `[N/A]` and its kin, and `nan` or `inf`, which
    some drivers print for a sensor they cannot read (an integer field included: int() of it raised)."""
    if _missing(value):
        return None
    try:
        n = float(value)
    except ValueError:
        raise GpuUnavailable(f"nvidia-smi: {what} is {value.strip()!r}, expected a number or [N/A]") from None
    return n if math.isfinite(n) else None


def _mib(value: str, what: str) -> int | None:
    n = _num(value, what)
    return None if n is None else int(n * MIB)


def _rows(text: str, n_fields: int, query: str) -> list[list[str]]:
    """The CSV lines of `text`, each exactly n_fields values; 'No running processes found' (older
    drivers print it even with noheader) is no rows."""
    rows = []
    for row in csv.reader(text.splitlines(), skipinitialspace=True):
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        if len(row) == 1 and row[0].startswith("No running"):
            continue
        if len(row) != n_fields:
            raise GpuUnavailable(f"nvidia-smi {query}: a line has {len(row)} fields, expected {n_fields}: "
                                 f"{','.join(row)[:200]!r}")
        rows.append([v.strip() for v in row])
    return rows


def parse_apps(text: str) -> list[ComputeProcess]:
    """`--query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader,nounits` output."""
    out = []
    for uuid, pid, used in _rows(text, len(APPS_FIELDS), "--query-compute-apps"):
        p = _num(pid, "pid")
        if p is None:
            continue  # a process the driver cannot name (another PID namespace): no one to attribute
        out.append(ComputeProcess(gpu_uuid=uuid, pid=int(p), used_bytes=_mib(used, "used_memory")))
    return out


def parse_gpus(text: str) -> list[GpuSample]:
    """`--query-gpu=<GPU_FIELDS>,<a throttle field> --format=csv,noheader,nounits` output."""
    out: list[GpuSample] = []
    for row in _rows(text, len(GPU_FIELDS) + 1, "--query-gpu"):
        index, uuid, used, total, util, power, sm, temp, reasons = row
        mask: int | None = None
        if not _missing(reasons):
            try:
                mask = int(reasons, 16)
            except ValueError:
                raise GpuUnavailable(f"nvidia-smi: throttle reasons are {reasons!r}, expected a hex mask") from None
        idx = _num(index, "index")
        out.append(GpuSample(
            index=int(idx) if idx is not None else len(out), uuid=uuid,
            memory_used_bytes=_mib(used, "memory.used"), memory_total_bytes=_mib(total, "memory.total"),
            utilization_pct=_num(util, "utilization.gpu"), power_w=_num(power, "power.draw"),
            sm_clock_mhz=_num(sm, "clocks.sm"), temperature_c=_num(temp, "temperature.gpu"),
            throttle_reasons=mask))
    return out


class SmiProvider:
    """Reads through the `nvidia-smi` on PATH (or `path`), each call one bounded subprocess."""

    name = "nvidia-smi"

    def __init__(self, path: str | None = None, timeout: float = READ_TIMEOUT_S) -> None:
        found = path or shutil.which("nvidia-smi")
        if not found:
            raise GpuUnavailable("no nvidia-smi on PATH")
        self.path = found
        self.timeout = timeout
        self._throttle_field = THROTTLE_FIELDS[0]

    def _query(self, query: str) -> tuple[int, str]:
        """(exit status, stdout) of one query; on failure the text is what it said, stderr first."""
        rc, out, err = run_bounded([self.path, query, FORMAT], self.timeout)
        return rc, out if rc == 0 else (err + out)

    def _ok(self, query: str) -> str:
        rc, text = self._query(query)
        if rc != 0:
            raise GpuUnavailable(f"nvidia-smi {query.split('=')[0]} exited {rc}: {text.strip()[:300]}")
        return text

    def processes(self) -> list[ComputeProcess]:
        return parse_apps(self._ok("--query-compute-apps=" + ",".join(APPS_FIELDS)))

    def samples(self) -> list[GpuSample]:
        base = "--query-gpu=" + ",".join(GPU_FIELDS) + ","
        rc, text = self._query(base + self._throttle_field)
        if rc != 0 and "valid field" in text:
            # This driver knows the reasons by the other name (see the module's docstring).
            other = next(f for f in THROTTLE_FIELDS if f != self._throttle_field)
            rc, text = self._query(base + other)
            if rc == 0:
                self._throttle_field = other
        if rc != 0:
            raise GpuUnavailable(f"nvidia-smi --query-gpu exited {rc}: {text.strip()[:300]}")
        return parse_gpus(text)
