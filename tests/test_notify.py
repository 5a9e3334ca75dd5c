"""genready.systemd.notify against a real AF_UNIX datagram socket standing in for systemd's notify socket."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from genready.systemd.notify import STATUS_MAX_BYTES, Notifier, one_line


class Listener:
    """A bound SOCK_DGRAM socket: what systemd's manager listens on."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def recv(self, timeout: float = 2.0) -> bytes:
        self.sock.settimeout(timeout)
        return self.sock.recv(65536)

    def assert_empty(self) -> None:
        self.sock.setblocking(False)
        with pytest.raises(BlockingIOError):
            self.sock.recv(65536)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # sun_path holds 108 bytes; pytest's tmp_path can be longer than that.
    d = Path(tempfile.mkdtemp(prefix="gr-notify-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def listener(short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Listener]:
    path = short_dir / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        yield Listener(sock)


def test_ready(listener: Listener) -> None:
    Notifier().ready()
    assert listener.recv() == b"READY=1"


def test_ready_with_status_is_one_datagram(listener: Listener) -> None:
    Notifier().ready(status="sglang: ready (pid 42)")
    assert listener.recv() == b"READY=1\nSTATUS=sglang: ready (pid 42)"
    listener.assert_empty()


def test_reloading_carries_monotonic_usec(listener: Listener) -> None:
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    Notifier().reloading()
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    first, second = listener.recv().split(b"\n")
    assert first == b"RELOADING=1"
    key, value = second.split(b"=")
    assert key == b"MONOTONIC_USEC"
    assert before <= int(value) <= after


def test_reloading_with_status(listener: Listener) -> None:
    Notifier().reloading(status="re-verifying")
    lines = listener.recv().split(b"\n")
    assert lines[0] == b"RELOADING=1"
    assert lines[1].startswith(b"MONOTONIC_USEC=")
    assert lines[2:] == [b"STATUS=re-verifying"]


def test_stopping(listener: Listener) -> None:
    Notifier().stopping()
    assert listener.recv() == b"STOPPING=1"


def test_watchdog_ping(listener: Listener) -> None:
    Notifier().watchdog_ping()
    assert listener.recv() == b"WATCHDOG=1"


def test_status_single_line(listener: Listener) -> None:
    Notifier().status("sglang: loading, 12 probes, last: connection refused")
    assert listener.recv() == b"STATUS=sglang: loading, 12 probes, last: connection refused"


def test_status_multiline_is_joined_and_cannot_inject(listener: Listener) -> None:
    Notifier().status("sglang: ready\n  vllm: loading  \n\nREADY=1\r\nSTOPPING=1")
    assert listener.recv() == b"STATUS=sglang: ready; vllm: loading; READY=1; STOPPING=1"
    listener.assert_empty()


def test_status_utf8_on_the_wire(listener: Listener) -> None:
    # sdnotify encodes Latin-1 on its own; systemd wants UTF-8 and rejects anything else.
    Notifier().status("llama — 読み込み中 ✓")
    assert listener.recv() == "STATUS=llama — 読み込み中 ✓".encode()


def test_status_controls_and_length(listener: Listener) -> None:
    Notifier().status("a\x00b\tc")
    assert listener.recv() == b"STATUS=a\\x00b c"  # escaped as everywhere (redact.escape), tab a space
    Notifier().status("é" * 5000)
    data = listener.recv()
    assert data.startswith(b"STATUS=\xc3\xa9")
    value = data.removeprefix(b"STATUS=")
    assert len(value) <= STATUS_MAX_BYTES
    assert value.decode("utf-8").endswith("…")  # cut on a character boundary


def test_empty_status_clears(listener: Listener) -> None:
    Notifier().status("")
    assert listener.recv() == b"STATUS="


def test_one_notifier_many_messages(listener: Listener) -> None:
    n = Notifier()
    n.status("loading")
    n.ready()
    n.watchdog_ping()
    n.stopping()
    expected = [b"STATUS=loading", b"READY=1", b"WATCHDOG=1", b"STOPPING=1"]
    assert [listener.recv() for _ in range(4)] == expected


def test_abstract_namespace_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"genready-test-{os.getpid()}-{time.monotonic_ns()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        Notifier().ready()
        sock.settimeout(2)
        assert sock.recv(1024) == b"READY=1"


def test_not_under_systemd_sends_nothing(monkeypatch: pytest.MonkeyPatch, listener: Listener) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET")
    n = Notifier()
    assert not n.under_systemd
    n.ready(status="x")
    n.reloading()
    n.stopping()
    n.status("x")
    n.watchdog_ping()
    assert n.notify("READY=1") is False
    listener.assert_empty()


def test_socket_error_is_logged_not_raised(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = short_dir / "gone.sock"
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    n = Notifier()
    with caplog.at_level(logging.DEBUG, logger="genready.systemd.notify"):
        n.ready()  # nobody listens: connect fails
    assert n.notify("READY=1") is False
    assert any("failed" in r.getMessage() for r in caplog.records)
    assert all(r.levelno == logging.DEBUG for r in caplog.records)
    # A listener that appears later is found: the next call connects afresh.
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        n.watchdog_ping()
        sock.settimeout(2)
        assert sock.recv(1024) == b"WATCHDOG=1"


def test_send_after_listener_went_away_does_not_raise(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = short_dir / "restart.sock"
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    n = Notifier()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        n.ready()
        sock.settimeout(2)
        assert sock.recv(1024) == b"READY=1"
    path.unlink()
    assert n.notify("WATCHDOG=1") is False  # connected peer is gone: ECONNREFUSED, swallowed
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:  # the manager re-executed
        sock.bind(str(path))
        n.watchdog_ping()
        sock.settimeout(2)
        assert sock.recv(1024) == b"WATCHDOG=1"


@pytest.mark.parametrize(
    ("usec", "pid", "expected"),
    [
        (None, None, None),
        ("30000000", None, 15.0),
        ("30000000", "self", 15.0),
        ("30000000", "other", None),
        ("1000", None, 0.0005),
        ("0", None, None),
        ("", None, None),
        ("thirty", None, None),
        ("30000000", "not-a-pid", None),
    ],
)
def test_watchdog_interval(
    monkeypatch: pytest.MonkeyPatch, usec: str | None, pid: str | None, expected: float | None
) -> None:
    for key, value in (("WATCHDOG_USEC", usec), ("WATCHDOG_PID", pid)):
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            value = {"self": str(os.getpid()), "other": str(os.getpid() + 1)}.get(value, value)
            monkeypatch.setenv(key, value)
    assert Notifier().watchdog_interval() == expected


def test_one_line() -> None:
    assert one_line("a\nb") == "a; b"
    assert one_line("  only  ") == "only"
    assert one_line("\n\n") == ""
    assert one_line("x" * 10, max_bytes=5) == "xx…"
