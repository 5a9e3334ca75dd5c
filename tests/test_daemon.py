"""The daemon's own decisions, in-process: the reload diff, and a start-up that fails halfway
closes what it had opened."""

from __future__ import annotations

import asyncio
import signal
import socket
from pathlib import Path
from typing import Any

import pytest

from genready import config
from genready.serve.daemon import Daemon, ReloadPlan, reload_plan
from genready.store.records import RecordStore


def targets(**units: Any) -> dict[str, config.TargetConfig]:
    """{name: unit} or {name: (unit, {settings})} as parsed targets."""
    tables = {}
    for name, spec in units.items():
        unit, extra = (spec, {}) if isinstance(spec, str) else spec
        tables[name] = {"unit": unit, "url": "http://127.0.0.1:9", **extra}
    return dict(config.parse({"targets": tables}).targets) if tables else {}


@pytest.mark.parametrize(("old", "new", "plan"), [
    ({"a": "a.service"}, {"a": "a.service"}, ReloadPlan((), (), (), False)),
    ({"a": "a.service"}, {"a": ("a.service", {"warmup": 2})}, ReloadPlan((), ("a",), (), False)),
    ({"a": "a.service"}, {"a": "a.service", "b": "b.service"}, ReloadPlan((), (), ("b",), True)),
    ({"a": "a.service", "b": "b.service"}, {"a": "a.service"}, ReloadPlan(("b",), (), (), True)),
    # The same name on another unit is another target: removed, then added anew.
    ({"a": "a.service"}, {"a": "x.service"}, ReloadPlan(("a",), (), ("a",), True)),
    # A rename onto the same unit: the units watched are the same, the watcher goes on.
    ({"a": "a.service"}, {"b": "a.service"}, ReloadPlan(("a",), (), ("b",), False)),
    ({"a": "a.service", "b": "b.service"},
     {"b": ("b.service", {"probe_timeout": 5.0}), "c": "c.service"},
     ReloadPlan(("a",), ("b",), ("c",), True)),
    # Only the kind: the verified start stands (the probe does not depend on it), /status's kind follows
    ({"a": "a.service"}, {"a": ("a.service", {"kind": "vllm"})}, ReloadPlan((), (), (), False, ("a",))),
    ({"a": "a.service"}, {"a": ("a.service", {"kind": "vllm", "warmup": 2})}, ReloadPlan((), ("a",), (), False)),
], ids=["unchanged", "settings", "added", "removed", "other-unit", "renamed", "all-at-once", "kind", "kind-and-more"])
def test_reload_plan(old: dict[str, Any], new: dict[str, Any], plan: ReloadPlan) -> None:
    got = reload_plan(targets(**old), targets(**new))
    assert got == plan
    assert got.empty is (plan == ReloadPlan((), (), (), plan.units_changed, ()))


async def test_a_failed_bind_closes_everything_start_up_opened(tmp_path: Path) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    cfg = config.parse({
        "daemon": {"listen": f"127.0.0.1:{port}", "bus": "user", "state_dir": str(tmp_path / "state"),
                   "runtime_dir": str(tmp_path / "run")},
        "targets": {"t": {"unit": "t.service", "url": "http://127.0.0.1:9"}},
    })
    before = asyncio.all_tasks()
    d = Daemon(cfg)
    try:
        with pytest.raises(OSError, match="address already in use"):
            await d.run()
    finally:
        taken.close()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.remove_signal_handler(sig)
    # Nothing left running: no watcher, no probe, no background task of the daemon's.
    assert asyncio.all_tasks() - before == set()
    assert d.targets == {} and d._watcher_task is None  # failed before any target was wired
    assert d._runner is not None and d._runner.server is None  # the HTTP runner was cleaned up
    # The record store's exclusive lock was released: another genready can take the directory.
    with RecordStore(tmp_path / "state") as store:
        store.load()
