"""A systemd manager that does not answer (SIGSTOPped) must not freeze genready.

The manager is a private one booted for this test alone: freezing the session's shared one
would stall every other test's units and clients.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from genready.vocab import SYSTEMD_UNRESPONSIVE
from genready_dev.harness import booted_manager
from genready_dev.hostile import frozen_manager
from genready_dev.usermanager import UserManager, unavailable_reason
from tests import ci

# While frozen the answers must come within 1 s (bench/frozen.py prints the figures); the test
# leaves room for a loaded machine, and checks what never depends on speed exactly.
ROOM = 3.0
# /status and /metrics never wait on systemd at all: a few ms each when nothing stalls the loop.
QUICK = 1.0


@pytest.fixture(scope="module")
def own_manager() -> Iterator[UserManager]:
    """One private manager for this module's tests: each freezes it in turn, never at once."""
    ci.require(unavailable_reason(), "a test that needs a private systemd user manager")
    with booted_manager() as um:
        yield um


@pytest.mark.system
def test_a_frozen_manager_makes_ready_503_and_leaves_the_api_answering(own_manager: UserManager,
                                                                        tmp_path: Path) -> None:
    f = frozen_manager(own_manager, tmp_path, seconds=3.0)
    ready = f.answers["/ready/t"]
    assert ready and all(code == 503 for _, code, _ in ready), [c for _, c, _ in ready]  # never 200
    assert all(str(body["reason"]).startswith(SYSTEMD_UNRESPONSIVE) for _, _, body in ready), ready[0]
    for path in ("/ready/t", "/status", "/metrics"):
        assert all(code in (200, 503) for _, code, _ in f.answers[path]), path
        assert f.slowest(path) < ROOM, (path, f.slowest(path))
    assert any(body["systemd_responsive"] is False for _, _, body in f.answers["/status"])
    assert "genready_systemd_responsive 0.0" in f.metrics_gauge
    # Said once each way, however many requests met the silence.
    assert f.log.count("does not answer") == 1, f.log
    assert f.log.count("answers again") == 1, f.log
    assert f.thaw_to_ready < ROOM, f.thaw_to_ready


@pytest.mark.system
def test_a_manager_frozen_as_the_watcher_re_reads_does_not_stall_genready(own_manager: UserManager,
                                                                          tmp_path: Path) -> None:
    """The watcher's connection is pystemd's, which keeps the GIL while sd-bus waits: a GetAll sent
    to a frozen manager would stop /ready, /status and /metrics alike until sd-bus gave up (5 s;
    measured before the probe: /ready 5.0-5.8 s). The manager freezes just as the watcher is to
    re-read every unit after a daemon-reload (frozen_manager's doc says how that moment is made
    certain); the worker's sdbus probe must find it silent and skip the read, and the resync after
    the thaw read it again.

    Not covered, by design: the manager freezing in the microseconds between the probe's answer and
    the pystemd call. That call then holds the GIL until sd-bus's method timeout (SD_BUS_TIMEOUT,
    5 s, which `serve` sets through SYSTEMD_BUS_TIMEOUT) ends it: the bound of the remaining stall."""
    f = frozen_manager(own_manager, tmp_path, seconds=3.0, during_reread=True)
    # The moment was the one meant: the re-read was due while frozen, and was skipped, not made.
    assert "frozen-sim.service not read now" in f.log, f.log
    ready = f.answers["/ready/t"]
    assert ready and all(code == 503 for _, code, _ in ready), [c for _, c, _ in ready]  # never 200
    assert all(str(body["reason"]).startswith(SYSTEMD_UNRESPONSIVE) for _, _, body in ready), ready[0]
    assert f.slowest("/ready/t") < ROOM, f.slowest("/ready/t")
    for path in ("/status", "/metrics"):
        assert all(code == 200 for _, code, _ in f.answers[path]), path
        assert f.slowest(path) < QUICK, (path, f.slowest(path))
    assert "genready_systemd_responsive 0.0" in f.metrics_gauge
    assert f.log.count("does not answer") == 1, f.log
    assert f.log.count("answers again") == 1, f.log
    assert f.thaw_to_ready < QUICK, f.thaw_to_ready
