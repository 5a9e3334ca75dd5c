"""The daemon's wiring, in-process: a systemd change handed to `Daemon._on_snapshot` (what the
watcher calls) reaches every surface (/ready, the stamp, sd_notify's READY=1/RELOADING=1 and
STATUS=, the metrics), and SIGHUP's reload adds, re-probes and removes targets, or keeps the
running config. The real Daemon, API, stamps, notify socket and metrics; systemd and the server
are the gate fakes (gatefakes.py says why). The same against a real manager: test_hookups.py,
test_reload.py, test_notify.py."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import faulthandler
import json
import logging
import os
import socket
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import tomli_w

from genready import config
from genready.rule.gate import TargetGate
from genready.serve import daemon as daemon_mod
from genready.serve.daemon import Daemon
from genready.store import durable, records
from genready_dev.harness import await_for, free_port
from tests.gatefakes import FakeFresh, ScriptedProber, failed, snap


class Wired:
    """A started Daemon whose systemd reads and probes are the gate fakes."""

    def __init__(self, tmp: Path, notify: socket.socket) -> None:
        self.tmp = tmp
        self.port = free_port()
        self.config_path = tmp / "genready.toml"
        self.notify = notify
        self.sent: list[str] = []
        self.fresh = FakeFresh()
        self.prober = ScriptedProber()
        self.d: Daemon | None = None

    def write_config(self, targets: dict[str, dict[str, Any]]) -> None:
        self.config_path.write_text(tomli_w.dumps({
            "daemon": {"listen": f"127.0.0.1:{self.port}", "bus": "user", "state_dir": str(self.tmp / "state"),
                       "runtime_dir": str(self.tmp / "run")},
            "targets": {n: {"url": "http://127.0.0.1:9", "verify_owner": False, "backoff_initial": 0.01,
                            "backoff_max": 0.02, **t} for n, t in targets.items()},
        }))

    @property
    def daemon(self) -> Daemon:
        assert self.d is not None
        return self.d

    def systemd_shows(self, unit: str, s: Any) -> None:
        """systemd now shows `s` for `unit`: to fresh reads, and as the watcher's event."""
        self.fresh.snap = s
        self.daemon._on_snapshot(unit, s)

    async def until(self, pred: Callable[[], object], what: str, timeout: float = 10.0) -> None:
        await await_for(pred, timeout, what, interval=0.005)

    async def get(self, path: str) -> tuple[int, Any]:
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{self.port}{path}") as r:
            return r.status, await r.json()

    def drain(self) -> None:
        """Read the notify socket as systemd does, at once: a full socket would block the sender."""
        with contextlib.suppress(BlockingIOError):
            while True:
                self.sent.append(self.notify.recv(65536).decode())

    def notifications(self) -> list[str]:
        """The notifications sent since the last call."""
        self.drain()
        out, self.sent = self.sent, []
        return out

    def metric(self, name: str, **labels: str) -> float | None:
        return self.daemon.metrics.registry.get_sample_value(name, labels)

    def stamp(self, target: str) -> dict[str, Any] | None:
        path = self.tmp / "run" / f"{target}.ready"
        return json.loads(path.read_text()) if path.exists() else None


@pytest.fixture
async def wired(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Wired]:
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    notify.setblocking(False)
    w = Wired(tmp_path, notify)
    asyncio.get_running_loop().add_reader(notify.fileno(), w.drain)
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify"))
    # No bus at all: the watcher retries in the background and never reports; the test speaks for it.
    monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", f"unix:path={tmp_path / 'no-bus'}")
    monkeypatch.setattr(daemon_mod, "FreshReader", lambda *a, **kw: w.fresh)
    monkeypatch.setattr(daemon_mod, "TargetGate", partial(TargetGate, prober_factory=lambda cfg: w.prober))  # type: ignore[arg-type,return-value]
    w.write_config({"t": {"unit": "t.service"}})
    w.d = Daemon(config.load(w.config_path), config_path=str(w.config_path))
    await w.d.startup()
    try:
        yield w
    finally:
        await w.d.shutdown()
        faulthandler.cancel_dump_traceback_later()  # shutdown's hard bound is for a real process
        asyncio.get_running_loop().remove_reader(notify.fileno())
        notify.close()


async def test_a_verified_start_reaches_every_surface(wired: Wired) -> None:
    assert not any("READY=1" in n for n in wired.notifications())  # nothing verified yet
    wired.systemd_shows("t.service", snap(pid=4242, inv="a" * 32))
    await wired.until(lambda: wired.daemon.targets["t"].gate.ready, "verified")
    code, body = await wired.get("/ready/t")
    assert code == 200 and body["pid"] == 4242
    stamp = wired.stamp("t")
    assert stamp is not None and stamp["pid"] == 4242 and stamp["invocation_id"] == "a" * 32
    sent = wired.notifications()
    assert any(n.startswith("READY=1") and "t: ready pid 4242" in n for n in sent), sent
    assert wired.metric("genready_ready", target="t", unit="t.service") == 1
    assert wired.metric("genready_state", target="t", unit="t.service", genready_state="ready") == 1
    assert wired.metric("genready_main_pid", target="t", unit="t.service") == 4242
    assert wired.metric("genready_starts_total", target="t", unit="t.service") == 1


async def test_a_revocation_reaches_every_surface_at_once(wired: Wired) -> None:
    wired.systemd_shows("t.service", snap(pid=4242))
    await wired.until(lambda: wired.daemon.targets["t"].gate.ready, "verified")
    wired.notifications()
    wired.prober.hold = asyncio.Event()  # the re-probe of the same instance stays out: no new verification
    wired.systemd_shows("t.service", snap(pid=4242, job=9))  # a restart job is queued
    # Synchronously, from the event: no await between the change and every surface saying so.
    assert not wired.daemon.targets["t"].gate.ready
    assert wired.stamp("t") is None
    assert wired.metric("genready_ready", target="t", unit="t.service") == 0
    assert wired.metric("genready_revocations_total", target="t", unit="t.service", reason="job_queued") == 1
    assert any(n.startswith("RELOADING=1") for n in wired.notifications())
    code, body = await wired.get("/ready/t")
    assert code == 503 and body["state"] == "starting"


async def test_a_failed_probe_is_counted_and_shown_in_status(wired: Wired) -> None:
    wired.prober.answer = lambda pid: failed()
    wired.systemd_shows("t.service", snap(pid=7))
    await wired.until(lambda: wired.daemon.targets["t"].gate.progress.probes >= 2, "two probes")
    assert (wired.metric("genready_probes_total", target="t", unit="t.service", result="http_status") or 0) >= 2
    code, body = await wired.get("/status")
    assert code == 200 and body["targets"]["t"]["state"] == "loading"
    assert body["targets"]["t"]["last_error"].startswith("http_status")


async def test_reload_adds_reprobes_and_removes_targets(wired: Wired) -> None:
    wired.systemd_shows("t.service", snap(pid=4242))
    await wired.until(lambda: wired.daemon.targets["t"].gate.ready, "verified")
    wired.write_config({"t": {"unit": "t.service", "warmup": 2}, "u": {"unit": "u.service"}})
    await wired.daemon._reload()
    assert list(wired.daemon.targets) == ["t", "u"]
    # t's settings changed: a verification made under the old ones is not kept.
    assert wired.metric("genready_revocations_total", target="t", unit="t.service", reason="config_changed") == 1
    assert wired.metric("genready_ready", target="u", unit="u.service") == 0  # u's series exist from the start
    wired.systemd_shows("t.service", snap(pid=4242))
    await wired.until(lambda: wired.daemon.targets["t"].gate.ready, "t verified again, twice over")
    assert wired.daemon.targets["t"].gate.progress.successes >= 2
    wired.write_config({"u": {"unit": "u.service"}})
    await wired.daemon._reload()
    assert list(wired.daemon.targets) == ["u"]
    assert wired.metric("genready_ready", target="t", unit="t.service") is None  # no stale series to alert on
    assert (await wired.get("/ready/t"))[0] == 404


async def test_a_target_removed_by_a_reload_leaves_nothing_behind(wired: Wired) -> None:
    """Its gate, last words, sweep warning, stamp and every series go with it: the daemon keeps no
    registry beside its Targets that could still hold the name."""
    wired.write_config({"t": {"unit": "t.service"}, "u": {"unit": "u.service"}})
    await wired.daemon._reload()
    wired.systemd_shows("t.service", snap(pid=4242))
    await wired.until(lambda: wired.daemon.targets["t"].gate.ready, "verified")
    gone = wired.daemon.targets["t"]
    assert wired.stamp("t") is not None and wired.metric("genready_starts_total", target="t", unit="t.service") == 1
    wired.write_config({"u": {"unit": "u.service"}})
    await wired.daemon._reload()
    assert list(wired.daemon.targets) == ["u"]
    assert wired.stamp("t") is None
    body = wired.daemon.metrics.render()[0]
    assert b'target="t"' not in body and b'target="u"' in body
    code, status = await wired.get("/status")
    assert code == 200 and list(status["targets"]) == ["u"]
    assert gone.gate._task is None or gone.gate._task.done()  # its probing stopped
    assert gone.lastwords is not None and not gone.lastwords._chores  # its reads of the unit's output too
    # Nothing else in the daemon (or its outputs and stamps) is keyed by the name any more.
    for holder in (wired.daemon, wired.daemon.outputs, wired.daemon.stamps, wired.daemon.summarizer):
        for attr, v in vars(holder).items():
            if isinstance(v, (dict, set, list)):
                assert "t" not in v and "stamp:t" not in v, f"{type(holder).__name__}.{attr} still holds t"


async def test_a_broken_config_on_reload_keeps_the_running_one_and_says_so(wired: Wired) -> None:
    wired.systemd_shows("t.service", snap(pid=4242))
    await wired.until(lambda: wired.daemon.targets["t"].gate.ready, "verified")
    wired.notifications()
    wired.config_path.write_text('[targets.t]\nunit = "t.service"\nurl = 5\n')
    await wired.daemon._reload()
    assert wired.daemon.targets["t"].gate.ready  # nothing was touched
    code, body = await wired.get("/status")
    assert code == 200 and "url" in body["config_error"] and str(wired.config_path) in body["config_error"]
    assert any("config reload refused" in n for n in wired.notifications())
    # Fixed again: the note goes away.
    wired.write_config({"t": {"unit": "t.service"}})
    await wired.daemon._reload()
    assert (await wired.get("/status"))[1]["config_error"] is None


async def test_a_records_write_that_fails_is_counted_logged_once_and_caught_up_off_the_loop(
    wired: Wired, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The store reports from its writer thread: the daemon's callbacks must hold up there."""
    caplog.set_level(logging.WARNING, logger="genready.serve.daemon")
    full = True
    real = durable.write_all

    def write_all(fd: int, data: bytes) -> None:  # a state_dir with no space left, for records only
        if full and records.RECORDS_FILE in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd, data)

    monkeypatch.setattr(durable, "write_all", write_all)
    inv = "f" * 32
    wired.systemd_shows("t.service", snap(pid=4242, inv=inv))
    await wired.until(lambda: wired.daemon.targets["t"].gate.ready, "verified, whatever the disk says")
    await wired.until(lambda: wired.metric("genready_record_errors_total"), "the failed write counted")
    assert wired.daemon.records_failing and wired.daemon.store.unsynced
    code, body = await wired.get("/status")
    assert code == 200 and body["targets"]["t"]["records"][0]["invocation_id"] == inv  # from memory
    records_file = wired.tmp / "state" / records.RECORDS_FILE
    assert inv not in records_file.read_text()
    full = False
    wired.daemon.catch_up()  # what upkeep does every UPKEEP_INTERVAL: asks the writer thread, returns at once
    await wired.until(lambda: not wired.daemon.records_failing, "the records caught up")
    assert inv in records_file.read_text() and not wired.daemon.store.unsynced
    said = [r.getMessage() for r in caplog.records]
    assert sum("cannot write start records" in m for m in said) == 1, said
    assert sum("start records are written" in m for m in said) == 1, said


class Passes:
    """Each time the daemon brings sd_notify and the stamps in line (Outputs.update), what the gate had
    done by then: (probes made, ready). One event is one probe's outcome, so the updates per event are
    the updates that share a probe count."""

    def __init__(self, wired: Wired) -> None:
        self.seen: list[tuple[int, bool]] = []
        out = wired.daemon.outputs
        real = out.update
        gate = wired.daemon.targets["t"].gate

        def update(*a: Any, **kw: Any) -> None:
            self.seen.append((gate.progress.probes, gate.ready))
            real(*a, **kw)

        out.update = update  # type: ignore[method-assign]

    def at(self, probes: int) -> list[tuple[int, bool]]:
        return [s for s in self.seen if s[0] == probes]


async def test_a_verification_updates_every_surface_once(wired: Wired) -> None:
    passes = Passes(wired)
    wired.systemd_shows("t.service", snap(pid=4242))
    assert len(passes.seen) == 1  # the snapshot: one pass
    g = wired.daemon.targets["t"].gate
    await wired.until(lambda: g.ready, "verified")
    assert passes.at(g.progress.probes) == [(g.progress.probes, True)], passes.seen
    sent = wired.notifications()
    assert sum(n.startswith("READY=1") for n in sent) == 1, sent
    assert not any(n.startswith("STATUS=") for n in sent[sent.index(next(n for n in sent if "READY=1" in n)) + 1:])


async def test_a_recheck_revocation_updates_every_surface_once(wired: Wired) -> None:
    wired.write_config({"t": {"unit": "t.service", "recheck_interval": 0.02, "failure_threshold": 1}})
    await wired.daemon._reload()
    g = wired.daemon.targets["t"].gate
    wired.systemd_shows("t.service", snap(pid=4242))
    await wired.until(lambda: g.ready, "verified")
    passes = Passes(wired)
    wired.prober.answer = lambda pid: failed()
    await wired.until(lambda: not g.ready, "revoked by a failed recheck")
    revoking = next(probes for probes, ready in passes.seen if not ready)  # the recheck that failed
    assert wired.metric("genready_revocations_total", target="t", unit="t.service", reason="recheck_failed") == 1
    assert passes.at(revoking) == [(revoking, False)], passes.seen


async def test_a_revocation_by_systemd_updates_every_surface_once(wired: Wired) -> None:
    wired.systemd_shows("t.service", snap(pid=4242))
    g = wired.daemon.targets["t"].gate
    await wired.until(lambda: g.ready, "verified")
    wired.prober.hold = asyncio.Event()
    passes = Passes(wired)
    wired.systemd_shows("t.service", snap(pid=4242, job=9))
    assert passes.seen == [(g.progress.probes, False)]


async def test_the_verifying_probe_sends_one_notification(wired: Wired) -> None:
    """The probe that verifies a start is one event: its progress line (STATUS=, paced to one a second)
    and READY=1 go out as one datagram, not two, however long the load took."""
    wired.prober.hold = asyncio.Event()
    wired.systemd_shows("t.service", snap(pid=4242))
    g = wired.daemon.targets["t"].gate
    await wired.until(lambda: wired.prober.calls >= 1, "the first probe out")
    wired.daemon.outputs._status_sent = float("-inf")  # the last STATUS= was long ago: progress is due
    wired.notifications()
    wired.prober.hold.set()
    await wired.until(lambda: g.ready, "verified")
    await asyncio.sleep(0)  # anything the pass left for the loop's next turn
    sent = wired.notifications()
    assert len(sent) == 1 and sent[0].startswith("READY=1"), sent


async def test_a_reload_updates_every_surface_once(wired: Wired) -> None:
    """SIGHUP is one event: re-probing one target (its verification revoked) and adding two, one of them
    on a unit already watched, bring sd_notify and the stamps in line once, at the end."""
    wired.write_config({"t": {"unit": "t.service"}, "v": {"unit": "t.service"}})
    await wired.daemon._reload()
    wired.systemd_shows("t.service", snap(pid=4242))
    await wired.until(lambda: all(g.ready for g in (t.gate for t in wired.daemon.targets.values())), "both verified")
    passes = Passes(wired)
    wired.write_config({"t": {"unit": "t.service", "warmup": 2}, "v": {"unit": "t.service"},
                        "u": {"unit": "u.service"}, "w": {"unit": "t.service"}})
    wired.prober.hold = asyncio.Event()  # the re-probes stay out: nothing else happens meanwhile
    await wired.daemon._reload()
    assert list(wired.daemon.targets) == ["t", "v", "u", "w"]
    assert wired.metric("genready_revocations_total", target="t", unit="t.service", reason="config_changed") == 1
    assert len(passes.seen) == 1, passes.seen
