"""outputs.py: READY=1, RELOADING=1, the ready stamp and the genready_ready gauge all follow
the readiness rule at the moment they are sent (there is no second rule).

The sd_notify side is real: a bound SOCK_DGRAM socket named by NOTIFY_SOCKET, as systemd's
manager listens. The gate runs in-process on the stand-ins of gatefakes.py.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from genready.serve import outputs
from genready.serve.metrics import Metrics
from genready.serve.outputs import Outputs, stamp_payload
from genready.serve.stamp import Stamps, stamp_path
from genready.serve.target import Target
from genready.systemd.notify import Notifier
from tests.gatefakes import Rig, snap


class Manager:
    """What systemd's manager hears on its notify socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        sock.setblocking(False)

    def heard(self) -> list[str]:
        out = []
        while True:
            try:
                out.append(self.sock.recv(65536).decode())
            except BlockingIOError:
                return out

    @staticmethod
    def keys(datagrams: list[str]) -> list[str]:
        """The state words (READY=1, RELOADING=1), in order; STATUS= lines left out."""
        return [line for d in datagrams for line in d.split("\n") if line in ("READY=1", "RELOADING=1")]


@pytest.fixture
def systemd(monkeypatch: pytest.MonkeyPatch) -> Iterator[Manager]:
    name = f"genready-test-outputs-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        yield Manager(sock)


class Surfaces:
    def __init__(self, rig: Rig, runtime: Path) -> None:
        self.rig, self.runtime = rig, runtime
        # A fresh registry per test; the gauges read from the gate at each scrape, as in the daemon.
        self.stamps = Stamps(runtime, lambda *a: None, lambda t: None)
        self.target = Target(rig.gate, stamps=self.stamps)
        self.metrics = Metrics("test", CollectorRegistry(), targets=lambda: [self.target.gauges()])
        self.out = Outputs(Notifier())
        self.listening = False
        # As the daemon does: every gate event brings the outputs in line.
        rig.events.then = self.update

    def update(self) -> None:
        self.out.update([self.target], listening=self.listening)

    @property
    def gauge(self) -> float | None:
        return self.metrics.registry.get_sample_value("genready_ready", {"target": "t", "unit": "t.service"})

    @property
    def stamp(self) -> dict[str, object] | None:
        p = stamp_path(self.runtime, "t")
        return json.loads(p.read_text()) if p.exists() else None

    def agree(self) -> None:
        """The gauge, the stamp and the rule say the same thing."""
        ready = self.rig.gate.ready
        assert self.gauge == (1.0 if ready else 0.0)
        assert (self.stamp is not None) is ready
        if ready:
            assert self.stamp == stamp_payload(self.rig.gate)


@pytest.fixture
async def surfaces(tmp_path: Path) -> AsyncIterator[Surfaces]:
    rig = Rig(tmp_path)
    s = Surfaces(rig, tmp_path / "run")
    yield s
    await rig.close()


async def test_verified_then_revoked_before_start_up_ends_sends_no_ready(systemd: Manager,
                                                                          surfaces: Surfaces) -> None:
    r = surfaces.rig
    # Verified while the API is not yet listening: not READY=1 yet (nobody could ask /ready).
    await r.ready(snap())
    surfaces.agree()
    assert Manager.keys(systemd.heard()) == []
    # Revoked before start-up ends: a restart job was queued.
    r.show(snap(job=9))
    surfaces.agree()
    # Now the API listens. A flag set at the first verification would say READY=1 here.
    surfaces.listening = True
    surfaces.update()
    assert Manager.keys(systemd.heard()) == []
    assert not surfaces.out.sent_ready
    # The new start is verified: now READY=1, once.
    r.show(snap(pid=200, inv="inv-b"))
    await r.until(lambda: r.gate.ready, "the new start verified")
    surfaces.agree()
    assert Manager.keys(systemd.heard()) == ["READY=1"]
    assert surfaces.stamp is not None and surfaces.stamp["pid"] == 200


async def test_after_start_up_a_revocation_is_reloading_until_verified_again(systemd: Manager,
                                                                             surfaces: Surfaces) -> None:
    r = surfaces.rig
    surfaces.listening = True
    await r.ready(snap())
    assert Manager.keys(systemd.heard()) == ["READY=1"]
    r.show(snap("deactivating", sub="stop-sigterm"))
    surfaces.agree()
    r.show(snap(pid=300, inv="inv-c"))
    await r.until(lambda: r.gate.ready, "verified again")
    surfaces.agree()
    assert Manager.keys(systemd.heard()) == ["RELOADING=1", "READY=1"]
    assert surfaces.stamp is not None and surfaces.stamp["pid"] == 300 and surfaces.stamp["ready_at"]


async def test_a_status_line_rides_every_update(systemd: Manager, surfaces: Surfaces) -> None:
    surfaces.listening = True
    surfaces.rig.show(snap("inactive", 0, ""))
    heard = systemd.heard()
    assert heard and heard[-1] == "STATUS=t: inactive (t.service is inactive)"


async def test_a_gate_that_is_not_gating_start_up_does_not_hold_ready(systemd: Manager, tmp_path: Path) -> None:
    rig = Rig(tmp_path, gate_startup=False)
    s = Surfaces(rig, tmp_path / "run")
    try:
        s.listening = True
        rig.show(snap("inactive", 0, ""))
        assert Manager.keys(systemd.heard()) == ["READY=1"]
        s.agree()
    finally:
        await rig.close()


async def test_probe_progress_is_rate_limited_and_state_changes_are_not(systemd: Manager, surfaces: Surfaces,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # Several loading targets are each probed several times a second: STATUS= carries their
    # progress at most once per PROGRESS_EVERY, while a change of state is sent at once.
    target = surfaces.target
    surfaces.listening = True
    surfaces.rig.show(snap("inactive", 0, ""))
    assert systemd.heard()[-1] == "STATUS=t: inactive (t.service is inactive)"
    surfaces.out.progress([target])  # well within PROGRESS_EVERY (1 s) of that STATUS=
    assert systemd.heard() == []
    surfaces.rig.show(snap("activating", 0, "inv-b"))  # a new state: starting
    heard = systemd.heard()
    assert heard and heard[-1].startswith("STATUS=t: starting"), heard
    monkeypatch.setattr(outputs, "PROGRESS_EVERY", 0.0)
    surfaces.out.progress([target], notes=["a note"])
    heard = systemd.heard()
    assert len(heard) == 1 and heard[0].startswith("STATUS=t: starting") and heard[0].endswith("; a note"), heard
