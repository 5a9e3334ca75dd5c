"""store/durable.py, the one way genready's files survive a crash whole: atomic replace, synced
append, fsync of a directory. In-process, on real files."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from genready.store import durable


def test_replace_puts_the_whole_file_with_its_mode_whatever_the_umask(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "f.conf"
    old = os.umask(0o077)
    try:
        durable.replace(path, b"one\n", mode=0o644, mkdir=True)
    finally:
        os.umask(old)
    assert path.read_bytes() == b"one\n" and stat.S_IMODE(path.stat().st_mode) == 0o644
    durable.replace(path, b"two\n", mode=0o600)
    assert path.read_bytes() == b"two\n" and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert os.listdir(path.parent) == ["f.conf"]


def test_a_failed_replace_leaves_the_old_file_and_no_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"old\n")

    def full(fd: int, data: bytes) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(durable, "write_all", full)
    with pytest.raises(OSError):
        durable.replace(path, b"new\n")
    assert path.read_bytes() == b"old\n" and os.listdir(tmp_path) == ["f"]


def test_replace_renames_over_a_planted_link_never_through_it(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    path = tmp_path / "stamp"
    path.symlink_to(victim)
    durable.replace(path, b"{}\n")
    assert victim.read_bytes() == b"precious\n" and not path.is_symlink() and path.read_bytes() == b"{}\n"


def test_keep_open_gives_the_new_file_in_append_mode(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_bytes(b"a\nb\nc\n")
    fd = durable.replace(path, b"c\n", mode=0o640, tmp_prefix="log.", keep_open=True)
    assert fd is not None
    try:
        durable.append(fd, b"d\n")
    finally:
        os.close(fd)
    assert path.read_bytes() == b"c\nd\n"


def test_a_failed_append_is_cut_back_off_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "results.jsonl"
    fd = durable.open_append(path, read=True)
    try:
        durable.append(fd, b'{"n":1}\n')
        real = durable.write_all

        def half(fd: int, data: bytes) -> None:  # the disk fills after half the line
            real(fd, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(durable, "write_all", half)
        with pytest.raises(OSError):
            durable.append(fd, b'{"n":2}\n')
        monkeypatch.undo()
        assert path.read_bytes() == b'{"n":1}\n'
        os.write(fd, b'{"torn')  # a crash mid-write
        durable.end_line(fd)
        durable.append(fd, b'{"n":3}\n')
    finally:
        os.close(fd)
    assert path.read_bytes().splitlines() == [b'{"n":1}', b'{"torn', b'{"n":3}']
