"""The daemon against hostile input, in-process: a real `Daemon` serving its API on loopback, with
no systemd bus (its targets stay `unknown`, which these cases do not need).

The config re-read: only a regular file of at most 1 MiB, read off the event loop with a
bounded wait; a reload that changes `daemon.listen` keeps the running address and says
"restart needed"; a long-poll on a target a reload removed answers 404 at once; the Host:
check against DNS rebinding; the records of removed targets forgotten after a retention.
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
from genready.client.guard import stale_config
from genready.rule.history import History, config_changes
from genready.serve import api, httplimits, stamp
from genready.serve import daemon as daemon_mod
from genready.serve.daemon import Daemon
from genready.store.records import RecordStore, StartRecord
from genready.systemd.snapshot import Snapshot
from genready.timewords import iso
from genready_dev.harness import await_for, free_port


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


@contextlib.asynccontextmanager
async def daemon_on(tmp_path: Path, **daemon: Any) -> AsyncIterator[Running]:
    """A Daemon started in this process, with targets a and b, on a free loopback port."""
    port = free_port()
    path = tmp_path / "genready.toml"
    write_config(path, port, tmp_path, **daemon)
    d = Daemon(config.load(path), config_path=str(path))
    await d.startup()
    r = Running(d, path, port, tmp_path)
    try:
        yield r
    finally:
        await r.http.close()
        await d._exit.aclose()  # shutdown() without its faulthandler deadline, which would end pytest


@pytest.fixture(autouse=True)
def no_bus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", f"unix:path={tmp_path}/no-bus")  # no systemd: targets unknown


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[Running]:
    async with daemon_on(tmp_path) as r:
        yield r


# -- what the config path may be ---------------------------------------------------------------

def test_only_a_regular_file_of_at_most_1_mib_is_read(tmp_path: Path) -> None:
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


def test_an_api_key_file_is_bounded_too(tmp_path: Path) -> None:
    fifo = tmp_path / "key"
    os.mkfifo(fifo)
    with pytest.raises(config.ConfigError, match="a FIFO"):
        config.parse({"targets": {"t": {"unit": "t.service", "url": "http://127.0.0.1:9", "api_key_file": str(fifo)}}})


def test_check_config_refuses_a_fifo_with_78_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    with pytest.raises(SystemExit) as e:
        cli.main(["check-config", "--config", str(fifo)])
    assert e.value.code == 78 and "a FIFO" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "big"])
async def test_a_reload_refuses_what_is_not_a_small_regular_file(running: Running, kind: str) -> None:
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


async def test_a_config_read_that_hangs_is_given_up_and_the_api_answers_meanwhile(
        running: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    release, entered, left = threading.Event(), threading.Event(), threading.Event()

    def hung(path: Path) -> config.Config:
        entered.set()
        release.wait(60)  # a file on a network mount that stopped answering
        left.set()
        raise config.ConfigError(str(path), "", "never reached")

    monkeypatch.setattr(config, "load", hung)
    monkeypatch.setattr(daemon_mod, "CONFIG_READ_TIMEOUT", 1.0)
    try:
        reload = asyncio.create_task(running.d._reload())
        await await_for(entered.is_set, 10, "the config read to begin")
        # The loop is free while the read hangs: /status answers while the read is still stuck
        # (only this test releases it), however long this machine takes to answer.
        code, _ = await running.get("/status", timeout=10)
        assert code == 200 and entered.is_set() and not left.is_set()
        await compat.wait_for(reload, 10)
        assert "not read within 1 s" in running.d.config_error
    finally:
        release.set()


# -- daemon.listen changed by a reload --------------------------------------------------------------

async def test_a_listen_change_keeps_the_address_and_says_restart_needed(
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


# -- a long-poll on a removed target --------------------------------------------------------------

async def test_a_long_poll_on_a_target_a_reload_removed_answers_404_at_once(running: Running) -> None:
    poll = asyncio.create_task(running.get("/ready/b?wait=60", timeout=70))
    assert running.d._runner is not None
    polls: api.LongPolls = running.d._runner.app[api.LONG_POLLS]  # type: ignore[assignment]
    # the request is in its handler, waiting
    await await_for(lambda: polls.active > 0 or poll.done(), 10, "the long-poll in its handler")
    assert not poll.done(), poll
    write_config(running.path, running.port, running.tmp, targets=("a",))
    await running.d._reload()
    t0 = time.monotonic()
    code, body = await compat.wait_for(poll, 5)
    assert code == 404 and "removed by a config reload" in body["error"], body
    assert time.monotonic() - t0 < 2


# -- Host: against DNS rebinding --------------------------------------------------------------------

@pytest.mark.parametrize(("host", "allowed"), [
    (None, True), ("", True), ("127.0.0.1:9901", True), ("127.0.0.1", True), ("[::1]:9901", True),
    ("localhost:9901", True), ("LOCALHOST.", True), ("10.1.2.3:80", True), ("genready.lan:9901", True),
    ("Genready.LAN", True), ("evil.example:9901", False), ("localhost.evil.example", False),
    ("127.0.0.1.nip.io:9901", False), ("genready.lan.evil.example", False),
])
def test_host_header_names_genready_or_is_refused(host: str | None, allowed: bool) -> None:
    assert httplimits.host_allowed(host, ["genready.lan"]) is allowed


async def test_a_foreign_host_gets_421_with_a_json_reason_and_is_counted(running: Running) -> None:
    async with running.http.get("/status", headers={"Host": "rebind.evil.example"}) as r:
        assert r.status == 421
        body = await r.json()
    assert "DNS rebinding" in body["error"] and "daemon.allowed_hosts" in body["error"], body
    async with running.http.get("/metrics") as r:
        assert 'genready_api_refused_total{why="host"} 1.0' in await r.text()
    # Named in daemon.allowed_hosts (a reload applies it): answered.
    write_config(running.path, running.port, running.tmp, allowed_hosts=["rebind.evil.example"])
    await running.d._reload()
    async with running.http.get("/status", headers={"Host": "rebind.evil.example:9901"}) as r:
        assert r.status == 200


def test_allowed_hosts_are_checked() -> None:
    with pytest.raises(config.ConfigError, match=r"daemon\.allowed_hosts: expected an array of host names"):
        config.parse({"daemon": {"allowed_hosts": ["genready.lan:9901"]},
                      "targets": {"t": {"unit": "t.service", "url": "http://127.0.0.1:9"}}})
    with pytest.raises(config.ConfigError, match=r"daemon\.allowed_hosts: expected an array, found string"):
        config.parse({"daemon": {"allowed_hosts": "genready.lan"},
                      "targets": {"t": {"unit": "t.service", "url": "http://127.0.0.1:9"}}})


# -- the records of removed targets ---------------------------------------------------------------

def record(target: str, iid: str, days_ago: float) -> StartRecord:
    when = iso(time.time() - days_ago * 86400)
    return StartRecord(target=target, unit=f"{target}.service", invocation_id=iid, main_pid=100, started_at=when,
                       active_at=when, ended_at=when, result="success", exit_code=None, exit_status=None,
                       n_restarts=0)


def test_records_of_targets_removed_long_ago_are_forgotten(tmp_path: Path) -> None:
    with RecordStore(tmp_path) as store:
        for target, days in (("a", 90), ("old", 40), ("recent", 5)):
            for i in range(3):
                store.remember(record(target, f"{target}{i}", days))
        gone = store.forget_removed({"a", "b"}, time.time() - 30 * 86400)
        assert gone == ["old"]
        assert store.all("old") == [] and len(store.all("recent")) == 3
        assert len(store.all("a")) == 3  # configured: kept, however old
    text = (tmp_path / "records.jsonl").read_text()
    assert '"old"' not in text and '"recent"' in text  # gone from the file too, not just from memory


async def test_the_daemon_forgets_them_at_start(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    with RecordStore(tmp_path / "state") as store:
        for i in range(5):
            store.remember(record("gone", f"g{i}", 31))
            store.remember(record("kept", f"k{i}", 29))
        store.remember(record("a", "a0", 400))
    async with daemon_on(tmp_path) as r:
        assert r.d.store.all("gone") == [] and len(r.d.store.all("kept")) == 5 and r.d.store.all("a")
    async with daemon_on(tmp_path, forget_removed_after=0.0) as r:  # 0: never
        assert len(r.d.store.all("kept")) == 5


# -- the unit's configuration changed since its running start ----------------------------------

def snap_with(exec_start: tuple[tuple[str, ...], ...], env: tuple[str, ...], *, stale: bool = False) -> Snapshot:
    return Snapshot("t.service", load_state="loaded", active_state="active", sub_state="running", main_pid=100,
                    invocation_id="a" * 32, exec_main_start_us=int(time.time() * 1e6), exec_start=exec_start,
                    environment=env, exec_stale=stale)


SERVER = (("/usr/bin/python3", "-m", "sglang.launch_server", "--mem-fraction-static", "0.8"),)


def test_a_start_records_what_it_runs_and_the_difference_is_said(tmp_path: Path) -> None:
    with RecordStore(tmp_path) as store:
        h = History("t", "t.service", store)
        started = snap_with(SERVER, ("A=1", "HF_TOKEN=hf_secret", "GONE=x"))
        rec = h.observe(started)
        assert rec is not None
        assert rec.exec_start == ("/usr/bin/python3 -m sglang.launch_server --mem-fraction-static 0.8",)
        assert config_changes(h.get(rec.invocation_id), started) == []
        edited = snap_with(((*SERVER[0][:-1], "0.9"),), ("A=2", "HF_TOKEN=hf_other", "NEW=y"))
        h.observe(edited)  # the record keeps what the start was started with
        changes = config_changes(h.get(rec.invocation_id), edited)
    assert changes == [
        "ExecStart: /usr/bin/python3 -m sglang.launch_server --mem-fraction-static 0.8 is now "
        "/usr/bin/python3 -m sglang.launch_server --mem-fraction-static 0.9",
        "Environment: A=1 is now A=2", "Environment: GONE=x removed",
        "Environment: HF_TOKEN=*** is now HF_TOKEN=***", "Environment: NEW=y added"]
    assert not any("hf_secret" in c or "hf_other" in c for c in changes)


def test_a_start_seen_before_a_daemon_reload_was_read_takes_the_next_read(tmp_path: Path) -> None:
    """daemon-reload (new drop-in) then restart: the new start's signal can arrive before the
    watcher has read the unit again; its record must not take the old settings for its own."""
    with RecordStore(tmp_path) as store:
        h = History("t", "t.service", store)
        rec = h.observe(snap_with(SERVER, ("A=1",), stale=True))  # the old settings, not read since the reload
        assert rec is not None and rec.exec_start is None and rec.environment is None
        fresh = snap_with(SERVER, ("A=2",))
        h.observe(fresh)
        got = h.get(rec.invocation_id)
        assert got is not None and got.environment == ("A=2",)
        assert config_changes(got, fresh) == []
        # Unknown (stale) now: nothing is claimed either way.
        assert config_changes(got, snap_with(SERVER, ("A=3",), stale=True)) == []


def test_guard_refuses_an_instance_that_does_not_run_its_units_configuration() -> None:
    pinned = {"pid": 100, "config_changed_since_start": True, "config_changes": ["Environment: A=1 is now A=2"]}
    why = stale_config("t", pinned)
    assert "pid 100 does not run its unit's configuration: Environment: A=1 is now A=2" in why
    assert "genready restart t" in why
    assert stale_config("t", {"pid": 100, "config_changed_since_start": False}) == ""


def test_genready_status_warns() -> None:
    text = format_status({"targets": {"t": {"unit": "t.service", "pid": 100, "state": "ready",
                                            "config_changed_since_start": True,
                                            "config_changes": ["Environment: A=1 is now A=2"]}}})
    assert "warning: t: t.service changed since pid 100 started" in text and "A=1 is now A=2" in text
