"""The /ready gate against real systemd units running the simulator.

Every scenario polls /ready continuously (every few ms) in a thread and checks the rule the
project exists for: no 200 ever names a PID other than the unit's MainPID at that time.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from genready.probe import owner
from genready_dev.harness import GENREADY, Genready, Simulator, free_port, http, show, sim_unit, wait_for
from genready_dev.usermanager import UserManager

FAST = {"backoff_initial": 0.05, "backoff_max": 0.3, "probe_timeout": 2.0}


@dataclass
class Answer:
    sent: float
    received: float
    status: int
    pid: int | None


class ReadyPoller(threading.Thread):
    """Polls /ready/TARGET as fast as it can and keeps every answer."""

    def __init__(self, g: Genready, target: str) -> None:
        super().__init__(daemon=True)
        self.url = f"{g.base}/ready/{target}"
        self.answers: list[Answer] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            # CLOCK_MONOTONIC, the clock of systemd's *TimestampMonotonic properties.
            sent = time.monotonic()
            status, body = http(self.url, timeout=5)
            pid = body.get("pid") if isinstance(body, dict) else None
            self.answers.append(Answer(sent, time.monotonic(), status, pid))
            self._halt.wait(0.003)

    def stop(self) -> list[Answer]:
        self._halt.set()
        self.join(10)
        return self.answers


@pytest.fixture
def poller() -> Iterator[list[ReadyPoller]]:
    made: list[ReadyPoller] = []
    yield made
    for p in made:
        p.stop()



def start_sim_target(manager: UserManager, tmp: Path, unit: str, *flags: str, restart: str = "no",
                     **target: Any) -> tuple[Genready, int]:
    port = free_port()
    manager.install_unit(unit, sim_unit(port, *flags, restart=restart,
                                        extra=f"StandardError=append:{tmp}/{unit}.log"))
    manager.systemctl("start", unit)
    g = Genready(manager, tmp, {"t": {"unit": unit, "url": f"http://127.0.0.1:{port}", **FAST, **target}}).start()
    return g, port


def left_active_at(manager: UserManager, unit: str) -> float:
    """When the old instance left `active` (monotonic s): a restart job was queued just before."""
    return int(manager.show(unit, "ActiveExitTimestampMonotonic")["ActiveExitTimestampMonotonic"]) / 1e6


def assert_never_stale(answers: list[Answer], after: float, new_pid: int) -> None:
    """Every 200 to a request sent after `after` (the old instance stopped being active) names the new MainPID.

    A request sent before that may rightly be answered for the old PID: systemd had not
    queued the restart yet when genready read it.
    """
    bad = [a for a in answers if a.status == 200 and a.sent > after and a.pid != new_pid]
    assert not bad, f"/ready said 200 for a pid that was not MainPID: {bad[:3]}"


@pytest.mark.parametrize("block", [True, False], ids=["blocking", "no-block"])
def test_restart_with_lingering_old_process(manager: UserManager, tmp_path: Path, block: bool,
                                            poller: list[ReadyPoller]) -> None:
    unit = f"tg-linger-{'b' if block else 'nb'}.service"
    g, port = start_sim_target(manager, tmp_path, unit, "--load-seconds", "1", "--linger-seconds", "3")
    try:
        old_pid, _ = show(manager, unit)
        wait_for(lambda: g.ready_pid("t") == old_pid, 20, "the first start verified")
        p = ReadyPoller(g, "t")
        poller.append(p)
        p.start()
        manager.systemctl("restart", *([] if block else ["--no-block"]), unit)
        # The old process still answers generations while it lingers: the lie genready must not tell.
        naive = http(f"http://127.0.0.1:{port}/v1/models", timeout=2)[0] if not block else 0
        new_pid = wait_for(lambda: (pid := show(manager, unit)[0]) not in (0, old_pid) and pid, 20, "new pid")
        wait_for(lambda: g.ready_pid("t") == new_pid, 30, "the new start verified")
        answers = p.stop()
        t_stop = left_active_at(manager, unit)
        assert_never_stale(answers, t_stop, new_pid)
        assert any(a.status == 503 for a in answers if a.sent > t_stop)
        if not block:
            assert naive == 200, "the simulator should linger and answer after SIGTERM"
        rec = next(r for r in g.records("t") if r["main_pid"] == new_pid)
        assert rec["ready_at"] and rec["load_seconds"] and rec["load_seconds"] >= 1.0
        assert rec["served_by_pid"] == new_pid
        old = next(r for r in g.records("t") if r["main_pid"] == old_pid)
        assert old["revoke_reason"] in ("job_queued", "inactive", "pid_changed", "invocation_changed")
    finally:
        g.stop()
        manager.systemctl("stop", unit)


def test_bind_early_models_answer_but_not_ready_until_generation(manager: UserManager, tmp_path: Path) -> None:
    unit = "tg-early.service"
    # 5 s: room for a slow start of the simulator on a loaded machine before /v1/models answers.
    g, port = start_sim_target(manager, tmp_path, unit, "--load-seconds", "5", "--bind-early")
    try:
        pid, _ = show(manager, unit)
        wait_for(lambda: http(f"http://127.0.0.1:{port}/v1/models")[0] == 200, 10, "/v1/models during load")
        models_ok_at = time.time()
        code, body = g.get("/ready/t")
        assert code == 503 and body["state"] in ("loading", "starting"), body
        assert body["ready"] is False and body["pid"] == pid

        def unhealthy() -> bool:
            """/health answers 503 while loading: once genready asks the bound server, the reason is the server's
            own "not ready", asked before any generation (a first probe may have come before the bind: refused)."""
            code, body = g.get("/ready/t")
            assert code == 503 and body["ready"] is False, body  # not ready before a generation, whatever it was told
            return str(body["last_error"] or "").startswith("unhealthy: GET /health: HTTP 503")

        wait_for(unhealthy, 4, "the loading server's own 503 as the reason")
        wait_for(lambda: g.ready_pid("t") == pid, 20, "ready after load")
        assert time.time() - models_ok_at > 1.0  # /v1/models said 200 long before a generation worked
    finally:
        g.stop()
        manager.systemctl("stop", unit)


# backoff_max 30 s: a backoff schedule alone would notice these loads only after ~25 s.
@pytest.mark.parametrize("shape", ["bind-late", "bind-early"])
def test_a_loading_server_is_noticed_without_waiting_for_backoff_max(manager: UserManager, tmp_path: Path,
                                                                     shape: str) -> None:
    unit = f"tg-pace-{shape}.service"
    # 4 s: genready's first probe must come before the simulator binds, on a loaded machine too
    # (at 2 s it once came after, under two pytest-xdist workers on a shared machine: 1 probe, not 2).
    flags = ["--load-seconds", "4", *(["--bind-early"] if shape == "bind-early" else [])]
    g, _ = start_sim_target(manager, tmp_path, unit, *flags, backoff_initial=30.0, backoff_max=30.0)
    try:
        pid, _ = show(manager, unit)
        wait_for(lambda: g.ready_pid("t") == pid, 15, "ready soon after the load, far before backoff_max")
        probes = g.status()["targets"]["t"]["probes"]
        if shape == "bind-late":
            assert probes == 2, probes  # refused once, then watched (not probed) until it listened
        else:
            assert probes > 3, probes  # the 503s were retried fast
    finally:
        g.stop()
        manager.systemctl("stop", unit)


def test_foreign_server_on_the_port_never_counts(manager: UserManager, tmp_path: Path) -> None:
    unit = "tg-foreign.service"
    with Simulator(tmp_path, "--reuse-port") as foreign:
        port = foreign.port
        # The unit's own server is still loading and has not bound: only the foreign one answers.
        manager.install_unit(unit, sim_unit(port, "--reuse-port", "--load-seconds", "600"))
        manager.systemctl("start", unit)
        try:
            g = Genready(manager, tmp_path, {"t": {"unit": unit, "url": f"http://127.0.0.1:{port}", **FAST}}).start()
            try:
                wait_for(lambda: g.status()["targets"]["t"]["probes"] >= 5, 20, "five probes")
                code, body = g.get("/ready/t")
                assert code == 503
                assert "foreign_owner" in (body["last_error"] or ""), body
                assert str(foreign.proc.pid) in body["last_error"]
                _, metrics = g.get("/metrics")
                assert 'genready_foreign_answers_total{target="t",unit="tg-foreign.service"}' in metrics
            finally:
                g.stop()
        finally:
            manager.systemctl("stop", unit)


def test_a_second_listener_after_the_verification_revokes_until_it_is_gone(manager: UserManager,
                                                                           tmp_path: Path) -> None:
    """A process outside the unit binds the target's port with SO_REUSEPORT after the unit's own
    server was verified: the kernel hands it a share of the connections. Readiness is revoked naming
    it, guard refuses, every surface says so; once it is gone the same start is verified again."""
    unit = "tg-second.service"
    g, port = start_sim_target(manager, tmp_path, unit, "--reuse-port")
    foreign: subprocess.Popen[bytes] | None = None
    try:
        pid, _ = show(manager, unit)
        wait_for(lambda: g.ready_pid("t") == pid, 20, "the unit's own server verified")
        foreign = subprocess.Popen([*GENREADY, "simulate", "--port", str(port), "--reuse-port"],
                                   stderr=subprocess.DEVNULL)
        wait_for(lambda: len(owner.listeners(port)) == 2, 10, "the second simulator listening")
        listening = time.monotonic()
        wait_for(lambda: g.get("/ready/t")[0] == 503, 10, "revoked for the second listener")
        print(f"\nrevoked {time.monotonic() - listening:.2f} s after the second listener appeared")
        # The first revocation is the listener scan's (foreign_listener), or a probe's that the kernel handed to the
        # stranger (foreign_owner) just before it: both name it, and the scan lists it within its period.
        wait_for(lambda: [x["pid"] for x in g.status()["targets"]["t"]["foreign_listeners"]] == [foreign.pid], 10,
                 "the listener scan naming the second listener")
        body = g.get("/ready/t")[1]
        assert str(foreign.pid) in body["reason"] and "foreign_" in body["reason"], body
        t = g.status()["targets"]["t"]
        assert not t["ready"] and str(foreign.pid) in (t["last_error"] or "")
        _, metrics = g.get("/metrics")
        labels = f'target="t",unit="{unit}"'
        assert f"genready_foreign_listeners{{{labels}}} 1.0" in metrics
        revoked = re.findall(rf'genready_revocations_total{{reason="foreign_(?:listener|owner)",{labels}}} (\S+)',
                             metrics)
        assert sum(float(v) for v in revoked) >= 1, metrics
        run = subprocess.run([*GENREADY, "guard", "t", "--url", g.base, "--", "true"], capture_output=True,
                             text=True, timeout=30)
        assert run.returncode != 0 and str(foreign.pid) in run.stderr, run.stderr
        foreign.send_signal(signal.SIGKILL)
        foreign.wait()
        wait_for(lambda: g.ready_pid("t") == pid, 20, "the same start verified again once it is gone")
        assert g.status()["targets"]["t"]["foreign_listeners"] == []
        rec = next(r for r in g.records("t") if r["main_pid"] == pid)
        assert rec["ready_at"] is not None
    finally:
        if foreign is not None and foreign.poll() is None:
            foreign.send_signal(signal.SIGKILL)
            foreign.wait()
        g.stop()
        manager.systemctl("stop", unit)


# A LISTEN socket on [::1] at a port, held by uid nobody, until its stdin closes.
SQUATTER = ("import socket, sys\ns = socket.socket(socket.AF_INET6); s.bind(('::1', int(sys.argv[1]))); s.listen()\n"
            "print('up', flush=True)\nsys.stdin.read()\n")


def test_a_localhost_url_leaves_ipv6_to_a_squatter_until_it_is_gone(manager: UserManager, tmp_path: Path) -> None:
    """The url says localhost (::1 and 127.0.0.1, as Debian's /etc/hosts has it: genready runs with
    such a file), the server listens on 127.0.0.1 only, and after the verification uid nobody binds
    [::1] at the same port: clients that try ::1 first reach it."""
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n")
    unit = "tg-localhost.service"
    port = free_port()
    manager.install_unit(unit, sim_unit(port, extra=f"StandardError=append:{tmp_path}/{unit}.log"))
    manager.systemctl("start", unit)
    g = Genready(manager, tmp_path, {"t": {"unit": unit, "url": f"http://localhost:{port}", **FAST}})
    g.wrapper = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                 f'mount --bind {hosts} /etc/hosts && exec "$@"', "sh"]
    g.start()
    squatter: subprocess.Popen[str] | None = None
    try:
        pid, _ = show(manager, unit)
        wait_for(lambda: g.ready_pid("t") == pid, 20, "verified on 127.0.0.1 (::1 refused)")
        squatter = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                     "/usr/bin/python3", "-c", SQUATTER, str(port)],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert squatter.stdout is not None and squatter.stdout.readline() == "up\n"
        wait_for(lambda: g.get("/ready/t")[0] == 503, 10, "revoked for the squatter on [::1]")
        # The scan names it; the reason is the scan's, or a later probe's that tried ::1 and met the squatter.
        found = wait_for(lambda: g.status()["targets"]["t"]["foreign_listeners"], 10, "the squatter listed")
        assert [(x["pid"], x["uid"], x["address"]) for x in found] == [(squatter.pid, 65534, "::1")], found
        squatter.kill()
        squatter.wait()
        wait_for(lambda: g.ready_pid("t") == pid, 20, "the same start verified again once it is gone")
        assert any("localhost" in w for w in g.status()["targets"]["t"]["warnings"])
    finally:
        if squatter is not None and squatter.poll() is None:
            squatter.kill()
            squatter.wait()
        g.stop()
        manager.systemctl("stop", unit)


def test_crash_revokes_then_ready_after_automatic_restart(manager: UserManager, tmp_path: Path,
                                                          poller: list[ReadyPoller]) -> None:
    unit = "tg-crash.service"
    # 3 s of readiness per start: long enough to be seen between two polls on a loaded machine.
    g, _ = start_sim_target(manager, tmp_path, unit, "--crash-after", "3", restart="always")
    try:
        first, _ = show(manager, unit)
        wait_for(lambda: g.ready_pid("t") == first, 20, "first start verified")
        p = ReadyPoller(g, "t")
        poller.append(p)
        p.start()
        # Every start crashes 3 s after it is ready; the next one must be verified in turn.
        wait_for(lambda: g.ready_pid("t") not in (None, first), 20, "a restarted server verified")
        answers = p.stop()
        assert any(a.status == 503 for a in answers), "the crash was never visible on /ready"
        recs = {r["main_pid"]: r for r in g.records("t")}
        assert recs[first]["ended_at"] and recs[first]["revoke_reason"] in ("pid_changed", "inactive",
                                                                             "invocation_changed")
        assert recs[first]["exit_status"] == 1 or recs[first]["result"] in ("exit-code", "signal")
    finally:
        g.stop()
        manager.systemctl("stop", unit)


def test_hang_times_out_and_rechecks_revoke(manager: UserManager, tmp_path: Path) -> None:
    unit = "tg-hang.service"
    g, _ = start_sim_target(manager, tmp_path, unit, probe_timeout=0.5, recheck_interval=0.2, failure_threshold=2)
    try:
        pid, _ = show(manager, unit)
        wait_for(lambda: g.ready_pid("t") == pid, 20, "verified before the hang")
        os.kill(pid, signal.SIGUSR1)  # the simulator hangs from now on (a timer raced the first verification)
        wait_for(lambda: g.get("/ready/t")[0] == 503, 20, "revoked by failed rechecks")
        body = g.get("/ready/t")[1]
        assert body["state"] in ("loading", "stuck") and "timeout" in (body["last_error"] or ""), body
        assert show(manager, unit)[0] == pid  # same process, still "running" for systemd
        rec = next(r for r in g.records("t") if r["main_pid"] == pid)
        assert rec["revoke_reason"] == "recheck_failed"
    finally:
        g.stop()
        manager.systemctl("stop", unit)


def test_restart_then_ready_is_never_200(manager: UserManager, tmp_path: Path) -> None:
    """`systemctl restart X && curl -sf …/ready` must fail every time, even when the old one lingers."""
    unit = "tg-and.service"
    g, _ = start_sim_target(manager, tmp_path, unit, "--load-seconds", "0.2", "--linger-seconds", "0.2")
    try:
        # 6 rounds of the real race (each ~1 s, 2 on a loaded machine; 15 took 32 s of every run);
        # the rule behind it (a job pending or another instance is never ready) is checked row by row
        # in test_gate_rules.py.
        for i in range(6):
            pid = wait_for(lambda: g.ready_pid("t"), 20, f"ready before restart {i}")
            assert pid == show(manager, unit)[0]
            manager.systemctl("restart", unit)
            code, body = g.get("/ready/t")
            assert code != 200, f"restart {i}: /ready said 200 right after the restart: {body}"
    finally:
        g.stop()
        manager.systemctl("stop", unit)


def test_ready_query_semantics(manager: UserManager, tmp_path: Path) -> None:
    unit = "tg-query.service"
    g, _ = start_sim_target(manager, tmp_path, unit, "--load-seconds", "0.5")
    try:
        pid, inv = show(manager, unit)
        wait_for(lambda: g.ready_pid("t") == pid, 20, "verified")
        code, body = g.get("/ready/t")
        assert code == 200 and body["invocation_id"] == inv and body["unit"] == unit and body["load_seconds"] > 0
        assert g.get("/ready")[0] == 200  # every target
        assert g.get(f"/ready/t?pid={pid}")[0] == 200
        assert g.get(f"/ready/t?pid={pid + 1}")[0] == 503
        assert g.get(f"/ready/t?invocation={inv}")[0] == 200
        assert g.get(f"/ready/t?invocation={'0' * 32}")[0] == 503
        assert g.get(f"/ready/t?since={time.time() - 3600}")[0] == 200
        # since= after this start: only a newer start counts, so wait= times out with 503.
        t0 = time.time()
        code, body = g.get(f"/ready/t?since={t0}&wait=0.5")
        assert code == 503 and time.time() - t0 >= 0.5 and "since" in body["reason"]
        # wait= returns as soon as a start newer than since= is verified.
        manager.systemctl("restart", "--no-block", unit)
        code, body = g.get(f"/ready/t?since={t0}&wait=30", timeout=40)
        assert code == 200 and body["pid"] == show(manager, unit)[0] != pid
        for bad in ("wait=abc", "wait=-1", "since=yesterday", "pid=0", "pid=x", "invocation=xyz", "foo=1",
                    "wait=nan"):
            code, body = g.get(f"/ready/t?{bad}")
            assert code == 400 and body["error"], bad
        assert g.get("/ready/nope")[0] == 404
        assert g.get("/nothing")[0] == 404
    finally:
        g.stop()
        manager.systemctl("stop", unit)
