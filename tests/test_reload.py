"""SIGHUP applies a new config to a running genready: targets added, changed and removed."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import tomli_w

from genready_dev.harness import Genready, free_port, show, sim_unit, wait_for
from genready_dev.usermanager import UserManager

FAST = {"backoff_initial": 0.05, "backoff_max": 0.3, "probe_timeout": 2.0}



def test_sighup_adds_changes_and_removes_targets(manager: UserManager, tmp_path: Path) -> None:
    ports = {u: free_port() for u in ("tr-a.service", "tr-b.service")}
    for unit, port in ports.items():
        manager.install_unit(unit, sim_unit(port))
        manager.systemctl("start", unit)
    a: dict[str, Any] = {"unit": "tr-a.service", "url": f"http://127.0.0.1:{ports['tr-a.service']}", **FAST}
    g = Genready(manager, tmp_path, {"a": a}).start()
    try:
        pid_a = show(manager, "tr-a.service")[0]
        wait_for(lambda: g.ready_pid("a") == pid_a, 20, "a verified")
        targets: dict[str, Any] = {
            "a": {**a, "warmup": 2},
            "b": {"unit": "tr-b.service", "url": f"http://127.0.0.1:{ports['tr-b.service']}", **FAST}}
        cfg = {"daemon": {"listen": f"127.0.0.1:{g.port}", "bus": "user", "state_dir": str(g.state_dir),
                          "runtime_dir": str(g.runtime_dir)}, "targets": targets}
        g.config_path.write_text(tomli_w.dumps(cfg))
        assert g.proc is not None
        g.proc.send_signal(signal.SIGHUP)
        pid_b = show(manager, "tr-b.service")[0]
        wait_for(lambda: g.ready_pid("b") == pid_b, 20, "the added target verified")
        # a's settings changed: its verification is redone under them, for the same start.
        wait_for(lambda: g.ready_pid("a") == pid_a, 20, "a verified again")
        recs = g.records("a")
        assert len(recs) == 1 and recs[0]["probes"] >= 2
        assert "config_changed" in g.get("/metrics")[1]
        del targets["a"]
        g.config_path.write_text(tomli_w.dumps(cfg))
        g.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: g.get("/ready/a")[0] == 404, 20, "a removed")
        assert g.ready_pid("b") == pid_b
        assert g.proc.poll() is None
    finally:
        g.stop()
        for unit in ports:
            manager.systemctl("stop", unit)


def test_a_target_added_on_a_watched_unit_gets_its_state_at_once(manager: UserManager, tmp_path: Path) -> None:
    """After a reload that renames a target or adds a second one on the same unit, the
    new target shows the unit's state as soon as it exists, not `unknown` until the unit changes."""
    unit = "tr-same.service"
    manager.install_unit(unit, "[Service]\nExecStart=/bin/sleep infinity\n")
    manager.systemctl("stop", unit)  # inactive, and nothing will change it during the test
    t = {"unit": unit, "url": f"http://127.0.0.1:{free_port()}", **FAST}
    g = Genready(manager, tmp_path, {"a": t}).start()
    try:
        wait_for(lambda: g.status()["targets"]["a"]["state"] == "inactive", 10, "a inactive")
        cfg: dict[str, Any] = {"daemon": {"listen": f"127.0.0.1:{g.port}", "bus": "user",
                                          "state_dir": str(g.state_dir), "runtime_dir": str(g.runtime_dir)}}
        assert g.proc is not None
        for names in (["a", "b"], ["c", "b"]):  # a second target on the unit; then a renamed
            cfg["targets"] = {n: t for n in names}
            g.config_path.write_text(tomli_w.dumps(cfg))
            g.proc.send_signal(signal.SIGHUP)

            def reloaded(names: list[str] = names) -> dict[str, Any] | None:
                targets: dict[str, Any] = g.status()["targets"]
                return targets if set(targets) == set(names) else None

            targets = wait_for(reloaded, 10, f"targets {names}")
            assert {n: targets[n]["state"] for n in names} == dict.fromkeys(names, "inactive"), targets
    finally:
        g.stop()
