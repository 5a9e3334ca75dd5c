"""A unit's output files are read from their end only: the last lines of a start, whatever the
size of the file before them (a failed start's lines in /status, a not_ready sweep point)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from genready.systemd import unitlog
from genready.systemd.unitlog import LINE_BYTES, TAIL_BYTES, OutputMark, tail_lines


def lines_of(path: Path, start: int = 0, n: int = 20) -> list[str]:
    fd = os.open(path, os.O_RDONLY)
    try:
        return tail_lines(fd, start, n)
    finally:
        os.close(fd)


def test_the_last_lines_come_from_the_end_without_reading_the_rest(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    with out.open("wb") as f:
        f.truncate(200 << 20)  # 200 MB of a hole: no line breaks in it at all
        f.seek(0, os.SEEK_END)
        f.write(b"".join(b"line %d\n" % i for i in range(30)))
    read: list[int] = []
    real = os.pread

    def counting(fd: int, size: int, offset: int) -> bytes:
        read.append(size)
        return real(fd, size, offset)

    monkeypatch.setattr(os, "pread", counting)
    assert lines_of(out) == [f"line {i}" for i in range(10, 30)]
    assert sum(read) <= unitlog.TAIL_BLOCK  # one block held all 20 lines


def test_at_most_the_byte_cap_is_read_and_a_line_cut_by_it_is_left_out(tmp_path: Path) -> None:
    out = tmp_path / "out"
    # Two lines only: a first one longer than the cap, then a short one.
    out.write_bytes(b"x" * (TAIL_BYTES + 10) + b"\nlast words\n")
    assert lines_of(out) == ["last words"]


def test_a_long_line_is_cut(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.write_bytes(b"a\n" + b"y" * 100_000 + b"\nz")  # the last line without its line break
    got = lines_of(out)
    assert got[0] == "a" and got[2] == "z"
    assert got[1] == "y" * LINE_BYTES + unitlog.CUT


def test_only_the_lines_after_the_mark(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.write_bytes(b"old 1\nold 2\n")
    mark = os.path.getsize(out)
    with out.open("ab") as f:
        f.write(b"new 1\r\nnew 2\n")
    assert lines_of(out, mark) == ["new 1", "new 2"]
    assert lines_of(out, 0, n=3) == ["old 2", "new 1", "new 2"]


def test_output_mark_reads_the_tail_of_a_truncated_file_from_its_start(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.write_bytes(b"short\n")
    m = OutputMark(0.0, {out: 1000})  # the file was longer at the mark: truncated since
    assert m.lines("user", "x.service") == ["short"]


@pytest.mark.system
def test_journal_lines_are_cut_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A unit that logs to the journal (no output file): journalctl's lines are cut as the files' are.
    (journalctl itself stands in here: these machines have no journald.)"""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "journalctl"
    fake.write_text("#!/bin/sh\necho 'first words'\nhead -c 100000 /dev/zero | tr '\\0' y\necho\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    got = OutputMark(0.0).lines("user", "x.service")
    assert got == ["first words", "y" * LINE_BYTES + unitlog.CUT]


@pytest.mark.system
def test_journal_bytes_that_are_not_utf8_cost_only_themselves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 41 #11: journald keeps a line's bytes as they came and `journalctl -o cat` writes them raw.
    A Latin-1 path, a stray 0xff or a character cut in two is replaced (U+FFFD) in its own line; the
    start's other lines are kept. A stand-in journalctl writes the bytes: these machines have no
    journald, and the bytes are journalctl's output, not anything genready makes."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "journalctl"
    fake.write_text("#!/bin/sh\nprintf 'loading /mod\\350le\\n\\377\\376 garbage\\nhalf \\342\\202\\nlast words\\n'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    got = OutputMark(0.0).lines("user", "x.service")
    assert got == ["loading /mod\ufffdle", "\ufffd\ufffd garbage", "half \ufffd", "last words"]
