"""Issue 24, the daemon's reload cases, in-process: a real `Daemon` serving its API on loopback,
with no systemd bus (its targets stay `unknown`, which these cases do not need).

#8 the config re-read: only a regular file of at most 1 MiB, read off the event loop with a
bounded wait; #16 a reload that changes `daemon.listen` keeps the running address and says
"restart needed"; #18 a long-poll on a target a reload removed answers 404 at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import tomli_w

from genready import cli, compat, config
from genready.client.client import format_status
from genready.serve import api, stamp
from genready.serve import daemon as daemon_mod
from genready.serve.daemon import Daemon
from genready_dev.harness import free_port


def write_config(path: Path, port: int, tmp: Path, targets: tuple[str, ...] = ("a", "b"), **daemon: Any) -> None:
    cfg = {"daemon": {"listen": f"127.0.0.1:{port}", "bus": "user", "state_dir": str(tmp / "state"),
                      "runtime_dir": str(tmp / "run"), **daemon},
           "targets": {n: {"unit": f"{n}.service", "url": "http://127.0.0.1:9"} for n in targets}}
    path.write_text(tomli_w.dumps(cfg))


class Running:
    def __init__(self, d: Daemon, path: Path, port: int, tmp: Path) -> None:
        self.d, self.path, self.port, self.tmp = d, path, port, tmp
        self.http = aiohttp.ClientSession(f"http://127.0.0.1:{port}")

    async def get(self, url: str, timeout: float = 10) -> tuple[int, Any]:
        async with self.http.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as r:
            return r.status, await r.json()


@pytest.fixture
async def running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Running]:
    monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", f"unix:path={tmp_path}/no-bus")  # no systemd: targets unknown
    port = free_port()
    path = tmp_path / "genready.toml"
    write_config(path, port, tmp_path)
    d = Daemon(config.load(path), config_path=str(path))
    await d.startup()
    r = Running(d, path, port, tmp_path)
    try:
        yield r
    finally:
        await r.http.close()
        await d._exit.aclose()  # shutdown() without its faulthandler deadline, which would end pytest


# -- #8: what the config path may be -----------------------------------------------------------

def test_8_only_a_regular_file_of_at_most_1_mib_is_read(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    big = tmp_path / "big.toml"
    big.write_bytes(b"#" * config.MAX_CONFIG_BYTES + b"\n")
    t0 = time.monotonic()
    for path, found in ((fifo, "a FIFO"), (Path("/dev/zero"), "a character device"), (tmp_path, "a directory"),
                        (big, "a file of more than 1,048,576 bytes")):
        with pytest.raises(config.ConfigError) as e:
            config.load(path)
        assert e.value.expected == "a regular file of at most 1 MiB" and e.value.found == found, str(e.value)
    assert time.monotonic() - t0 < 5  # no open() waited for a FIFO's writer, nothing read /dev/zero to the end


def test_8_an_api_key_file_is_bounded_too(tmp_path: Path) -> None:
    fifo = tmp_path / "key"
    os.mkfifo(fifo)
    with pytest.raises(config.ConfigError, match="a FIFO"):
        config.parse({"targets": {"t": {"unit": "t.service", "url": "http://127.0.0.1:9", "api_key_file": str(fifo)}}})


def test_8_check_config_refuses_a_fifo_with_78_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    with pytest.raises(SystemExit) as e:
        cli.main(["check-config", "--config", str(fifo)])
    assert e.value.code == 78 and "a FIFO" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "big"])
async def test_8_a_reload_refuses_what_is_not_a_small_regular_file(running: Running, kind: str) -> None:
    running.path.unlink()
    if kind == "fifo":
        os.mkfifo(running.path)
    elif kind == "dev-zero":
        running.path.symlink_to("/dev/zero")
    else:
        running.path.write_bytes(b"#" * (2 << 20))
    t0 = time.monotonic()
    await running.d._reload()
    assert time.monotonic() - t0 < 5
    code, status = await running.get("/status")
    assert code == 200 and set(status["targets"]) == {"a", "b"}  # the running config is kept
    assert "a regular file of at most 1 MiB" in status["config_error"], status["config_error"]


async def test_8_a_config_read_that_hangs_is_given_up_and_the_api_answers_meanwhile(
        running: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()

    def hung(path: Path) -> config.Config:
        release.wait(60)  # a file on a network mount that stopped answering
        raise config.ConfigError(str(path), "", "never reached")

    monkeypatch.setattr(config, "load", hung)
    monkeypatch.setattr(daemon_mod, "CONFIG_READ_TIMEOUT", 1.0)
    try:
        reload = asyncio.create_task(running.d._reload())
        t0 = time.monotonic()
        code, _ = await running.get("/status", timeout=0.5)  # the loop is free while the read hangs
        assert code == 200 and time.monotonic() - t0 < 0.5
        await compat.wait_for(reload, 10)
        assert "not read within 1 s" in running.d.config_error
    finally:
        release.set()


# -- #16: daemon.listen changed by a reload ---------------------------------------------------------

async def test_16_a_listen_change_keeps_the_address_and_says_restart_needed(
        running: Running, capsys: pytest.CaptureFixture[str]) -> None:
    other = free_port()
    write_config(running.path, other, running.tmp)
    await running.d._reload()
    code, status = await running.get("/status")  # still on the old port
    assert code == 200
    [why] = status["restart_needed"]
    assert why.startswith("restart needed: daemon.listen changed") and f"127.0.0.1:{other}" in why, why
    assert running.d.cfg.daemon.listen == f"127.0.0.1:{running.port}"
    assert why in running.d._notes()  # STATUS= shows the notes
    assert why in format_status(status)
    # check-config of the same file says so too, naming the running daemon.
    assert stamp.read_running(running.tmp / "run") is not None
    with contextlib.suppress(SystemExit):
        cli.main(["check-config", "--config", str(running.path)])
    err = capsys.readouterr().err
    assert "restart needed: daemon.listen changed" in err and f"pid {os.getpid()}" in err, err
    # Put back: nothing is needed any more.
    write_config(running.path, running.port, running.tmp)
    await running.d._reload()
    assert (await running.get("/status"))[1]["restart_needed"] == []


# -- #18: a long-poll on a removed target ---------------------------------------------------------

async def test_18_a_long_poll_on_a_target_a_reload_removed_answers_404_at_once(running: Running) -> None:
    poll = asyncio.create_task(running.get("/ready/b?wait=60", timeout=70))
    assert running.d._runner is not None
    polls = running.d._runner.app[api.LONG_POLLS]
    deadline = time.monotonic() + 10
    while polls.active == 0:  # type: ignore[attr-defined]  # the request is in its handler, waiting
        assert time.monotonic() < deadline and not poll.done()
        await asyncio.sleep(0.01)
    write_config(running.path, running.port, running.tmp, targets=("a",))
    await running.d._reload()
    t0 = time.monotonic()
    code, body = await compat.wait_for(poll, 5)
    assert code == 404 and "removed by a config reload" in body["error"], body
    assert time.monotonic() - t0 < 2
