"""A unit's own last words: the lines one start of it wrote, from its output files or the journal.

Used by `genready sweep` (a not_ready point's `journal`) and by the daemon (a failed start in
/status and `genready status`). Units may log to files (StandardOutput=append:… — these machines
have no journald) or to the journal; both are handled. Every line passes through `redact` first:
a server's output holds its API key (SGLang logs its whole ServerArgs at start).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from genready.redact import redact_lines

OUTPUT_LINES: Final = 20  # lines of a start's output kept: a not_ready sweep point, a failed start
JOURNALCTL_TIMEOUT: Final = 10.0
# An output file is read from its end only, in blocks, back to OUTPUT_LINES lines or TAIL_BYTES,
# whichever comes first: a server's log of 150 MB once read whole took genready from 49 MB to
# 454 MB RSS, over the shipped unit's MemoryMax=256M. Each line is cut at LINE_BYTES.
TAIL_BYTES: Final = 1 << 20
TAIL_BLOCK: Final = 64 << 10
LINE_BYTES: Final = 2048
CUT: Final = " [...]"  # ends a line cut at LINE_BYTES
# first_line: a start's output is searched forward from the mark for one line (vLLM's "non-default args"),
# through at most HEAD_BYTES; that line is kept to FIRST_LINE_BYTES (it holds every flag's value).
HEAD_BYTES: Final = 8 << 20
FIRST_LINE_BYTES: Final = 64 << 10


def output_files(fragment_path: str, dropin_paths: Sequence[str]) -> list[Path]:
    """Files the unit's stdout/stderr go to (StandardOutput=file:/append:/truncate:), from its unit files.

    systemd does not publish these paths on D-Bus, so they are read from the fragment and drop-ins
    it loaded; a path with a %-specifier is skipped rather than guessed.
    """
    settings: dict[str, str] = {}
    for path in (fragment_path, *dropin_paths):
        if not path:
            continue
        try:
            text = Path(path).read_text(errors="replace")
        except OSError:
            continue
        section = ""
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("["):
                section = line
            elif section == "[Service]" and "=" in line:
                k, v = (x.strip() for x in line.split("=", 1))
                if k in ("StandardOutput", "StandardError"):
                    settings[k] = v
    out: list[Path] = []
    for v in settings.values():
        kind, _, where = v.partition(":")
        if kind in ("file", "append", "truncate") and where.startswith("/") and "%" not in where:
            out.append(Path(where))
    return list(dict.fromkeys(out))


@dataclass
class OutputMark:
    """Where the unit's output stood when a start began, to show only that start's lines."""

    since: float
    sizes: dict[Path, int] = field(default_factory=dict)

    @classmethod
    def take(cls, fragment_path: str, dropin_paths: Sequence[str], since: float | None = None) -> OutputMark:
        sizes = {}
        for p in output_files(fragment_path, dropin_paths):
            with contextlib.suppress(OSError):
                sizes[p] = p.stat().st_size
            sizes.setdefault(p, 0)
        return cls(time.time() if since is None else since, sizes)

    def lines(self, bus_kind: str, unit: str, n: int = OUTPUT_LINES, secrets: Iterable[str] = ()) -> list[str]:
        """The last `n` lines the unit wrote since the mark, secrets masked: from its output files,
        else from the journal. Blocking (file reads, journalctl): the daemon calls it off its loop."""
        return redact_lines(self._raw(bus_kind, unit, n), secrets)

    def first_line(self, bus_kind: str, unit: str, marker: str, secrets: Iterable[str] = ()) -> str | None:
        """The first line the unit wrote since the mark that holds `marker`, secrets masked; None if none
        within HEAD_BYTES of output. Blocking (file reads, journalctl)."""
        raw = marker.encode()
        for p, size in self.sizes.items():
            try:
                with p.open("rb") as f:
                    start = size if os.fstat(f.fileno()).st_size >= size else 0
                    line = head_line(f.fileno(), start, raw)
            except OSError:
                continue
            if line is not None:
                return redact_lines([line], secrets)[0]
        if self.sizes:
            return None
        cmd = ["journalctl", "--user-unit" if bus_kind == "user" else "--unit", unit, "--since",
               f"@{int(self.since)}", "-o", "cat", "--no-pager", "-q"]
        try:
            with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) as proc:
                assert proc.stdout is not None
                # a journalctl that hangs is killed: the read then meets the end of its output
                watchdog = threading.Timer(JOURNALCTL_TIMEOUT, proc.kill)
                watchdog.start()
                try:
                    line = head_line(proc.stdout.fileno(), 0, raw, stream=True)
                finally:
                    watchdog.cancel()
                    proc.kill()
        except OSError:
            return None
        return None if line is None else redact_lines([line], secrets)[0]

    def _raw(self, bus_kind: str, unit: str, n: int) -> list[str]:
        if self.sizes:
            out: list[str] = []
            for p, size in self.sizes.items():
                try:
                    with p.open("rb") as f:
                        start = size if os.fstat(f.fileno()).st_size >= size else 0  # a truncate: from 0
                        out += tail_lines(f.fileno(), start, n)
                except OSError:
                    continue
            return out[-n:]
        cmd = ["journalctl", "--user-unit" if bus_kind == "user" else "--unit", unit, "--since",
               f"@{int(self.since)}", "-o", "cat", "-n", str(n), "--no-pager", "-q"]
        try:
            # Bytes, not text: journald keeps a line's bytes as they came and `-o cat` writes them raw
            # (a Latin-1 path, binary garbage, a character cut by journald's 48 KiB line split), so a
            # strict decode of the whole output would lose every line for one bad byte.
            done = subprocess.run(cmd, capture_output=True, timeout=JOURNALCTL_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired):
            return []
        # Decoded line by line (errors="replace") and cut as the files' lines are.
        return [_cut(line) for line in done.stdout.splitlines()[-n:]] if done.returncode == 0 else []


def tail_lines(fd: int, start: int, n: int = OUTPUT_LINES, cap: int = TAIL_BYTES) -> list[str]:
    """The last `n` lines of the file `fd` between offset `start` and its end, read backwards in
    blocks and never more than `cap` bytes; each line cut at LINE_BYTES. A line that began before
    the bytes read (the cap was reached inside it) is left out."""
    end = os.fstat(fd).st_size
    floor = max(start, end - cap)
    pos, blocks, newlines = end, [], 0
    # n + 1 line breaks: the last line may end with one, and the first one read may be partial.
    while pos > floor and newlines <= n:
        size = min(TAIL_BLOCK, pos - floor)
        pos -= size
        block = os.pread(fd, size, pos)
        if not block:  # shrunk meanwhile
            break
        blocks.append(block)
        newlines += block.count(b"\n")
    data = b"".join(reversed(blocks))
    if pos > start and b"\n" in data:
        data = data[data.index(b"\n") + 1:]  # began before what was read: not a whole line
    lines = [_cut(line) for line in data.split(b"\n")]
    if lines and not lines[-1]:
        lines.pop()  # the final line break ends the last line; it starts none
    return [x for line in lines for x in line.splitlines() or [""]][-n:]


def head_line(fd: int, start: int, marker: bytes, *, stream: bool = False, cap: int = HEAD_BYTES) -> str | None:
    """The first line holding `marker` in `fd` from offset `start` (a pipe: `stream`), read forward in blocks
    through at most `cap` bytes; the line cut at FIRST_LINE_BYTES (CUT marks it)."""
    pos, seen, buf = start, 0, b""
    while seen < cap:
        block = os.read(fd, TAIL_BLOCK) if stream else os.pread(fd, TAIL_BLOCK, pos)
        if not block:
            break
        pos, seen = pos + len(block), seen + len(block)
        buf += block
        at = buf.find(marker)
        if at >= 0:
            begin = buf.rfind(b"\n", 0, at) + 1
            end = buf.find(b"\n", at)
            while end < 0 and len(buf) - begin <= FIRST_LINE_BYTES and seen < cap:
                more = os.read(fd, TAIL_BLOCK) if stream else os.pread(fd, TAIL_BLOCK, pos)
                if not more:
                    break
                pos, seen = pos + len(more), seen + len(more)
                buf += more
                end = buf.find(b"\n", at)
            line = buf[begin:end if end >= 0 else len(buf)].rstrip(b"\r")
            if len(line) <= FIRST_LINE_BYTES:
                return line.decode(errors="replace")
            return line[:FIRST_LINE_BYTES].decode(errors="ignore") + CUT
        # keep what may be the start of the marker's line: from the last line break (or a marker's length)
        cut = buf.rfind(b"\n")
        buf = buf[cut + 1:] if cut >= 0 else buf[-(FIRST_LINE_BYTES + len(marker)):]
    return None


def _cut(line: bytes) -> str:
    line = line.rstrip(b"\r")
    if len(line) <= LINE_BYTES:
        return line.decode(errors="replace")
    return line[:LINE_BYTES].decode(errors="ignore") + CUT
