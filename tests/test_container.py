"""owner = "container" against real docker containers run by real systemd units.

The simulator runs inside a container (tests/containers.py); genready must accept an answer only
from the container that the unit's current start created: never from the previous start's
container while it lingers, never from a container started outside the unit.
"""

from __future__ import annotations

import datetime
import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from genready.compat import UTC
from genready.config import ConfigError, parse
from genready.probe.container import (
    Container,
    EngineError,
    UnitStart,
    conmon_container,
    conntrack_reply,
    container_of_cgroup,
    inspect,
    judge,
    name_from_cmdline,
    parse_time_us,
)
from genready_dev.harness import PY, Genready, free_port, http, show, wait_for
from genready_dev.usermanager import UserManager
from tests.containers import PREFIX, Docker, Podman
from tests.test_units import UNITS, hardened_variant

FAST = {"backoff_initial": 0.05, "backoff_max": 0.3, "probe_timeout": 2.0, "owner": "container"}


@dataclass
class Answer:
    sent: float  # CLOCK_MONOTONIC, the clock of systemd's *TimestampMonotonic properties
    received_wall: float  # CLOCK_REALTIME, the clock of a container's creation time
    status: int


class ReadyPoller(threading.Thread):
    """Polls /ready/t every few ms and keeps every answer."""

    def __init__(self, g: Genready) -> None:
        super().__init__(daemon=True)
        self.url = f"{g.base}/ready/t"
        self.answers: list[Answer] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            sent = time.monotonic()
            status, _ = http(self.url, timeout=5)
            self.answers.append(Answer(sent, time.time(), status))
            self._halt.wait(0.005)

    def stop(self) -> list[Answer]:
        self._halt.set()
        if self.is_alive():
            self.join(10)
        return self.answers


def ready(g: Genready, target: str = "t") -> dict[str, Any] | None:
    code, body = g.get(f"/ready/{target}")
    return body if code == 200 and isinstance(body, dict) else None


def created(c: dict[str, Any]) -> float:
    return parse_time_us(c["Created"]) / 1e6


def record_of(g: Genready, main_pid: int, target: str = "t") -> dict[str, Any]:
    return next(r for r in g.records(target) if r["main_pid"] == main_pid)


def assert_no_false_ready(answers: list[Answer], old_left: float, new_created: float) -> None:
    """No 200 to a request sent after the old start left `active` arrived before the new container
    even existed: such a 200 could only have been the old container's answer."""
    bad = [a for a in answers if a.status == 200 and a.sent > old_left and a.received_wall < new_created]
    assert not bad, f"/ready said 200 before the new container existed: {bad[:3]}"


def left_active_at(manager: UserManager, unit: str) -> float:
    return int(manager.show(unit, "ActiveExitTimestampMonotonic")["ActiveExitTimestampMonotonic"]) / 1e6


def test_published_port_verified_then_restart_with_lingering_old_container(
        manager: UserManager, docker: Docker, tmp_path: Path) -> None:
    """docker run -p: the answer comes through docker-proxy. On restart the old container keeps
    answering (its simulator lingers after SIGTERM, the client is killed after 0.5 s) and the new
    `docker run` fails until the name is free; only the new container may make the unit ready."""
    unit, name, port = "tc-pub.service", PREFIX + "pub", free_port()
    manager.install_unit(unit, docker.unit(name, port, "--linger-seconds", "4", log=tmp_path / "unit.log",
                                           stop_timeout=0.5))
    manager.systemctl("start", unit)
    target = {"unit": unit, "url": f"http://127.0.0.1:{port}", **FAST}
    g = Genready(manager, tmp_path, {"t": target, "p": {**target, "owner": "process"}}).start()
    poller = ReadyPoller(g)
    try:
        first_pid = wait_for(lambda: ready(g), 60, "the first container verified")["pid"]
        old = docker.inspect(name)
        assert old is not None
        assert record_of(g, first_pid)["served_by_pid"] == old["State"]["Pid"]
        # The process rule refuses docker-proxy (dockerd's child, not the unit's) and says what to do.
        wait_for(lambda: 'set owner = "container"' in (g.status()["targets"]["p"]["last_error"] or ""), 10,
                 "the process rule refusing docker-proxy")
        assert ready(g, "p") is None

        poller.start()
        manager.systemctl("restart", unit)
        # The lie genready must not tell: the old container still generates after the restart.
        assert http(f"http://127.0.0.1:{port}/v1/models", timeout=2)[0] == 200
        assert (c := docker.inspect(name)) is not None and c["Id"] == old["Id"]
        body = wait_for(lambda: ready(g), 30, "the new container verified")
        answers = poller.stop()
        # By name, now: an earlier attempt may have made a container that failed to start (the
        # old one's port not yet released) and was removed.
        new = docker.inspect(name)
        assert new is not None and new["Id"] != old["Id"]
        assert_no_false_ready(answers, left_active_at(manager, unit), created(new))
        assert body["pid"] == show(manager, unit)[0] != first_pid
        assert record_of(g, body["pid"])["served_by_pid"] == new["State"]["Pid"]
    finally:
        poller.stop()
        g.stop()
        manager.systemctl("stop", unit)
        docker.run("rm", "-f", name, check=False)  # it lingers after the stop: not into the next test


def test_network_host_restart_refuses_the_old_container(manager: UserManager, docker: Docker, tmp_path: Path) -> None:
    """--network host, no --name, -e INVOCATION_ID: the new container loads for 2 s while the old
    one lingers on the same port (SO_REUSEPORT), so for those seconds only the old one answers,
    and it must be refused as old; then the new one is verified."""
    unit, port = "tc-host.service", free_port()
    manager.install_unit(unit, docker.unit("", port, "--reuse-port", "--load-seconds", "2", "--linger-seconds", "5",
                                           network="host", extra=("-e", "INVOCATION_ID", "--label", PREFIX + "host"),
                                           log=tmp_path / "unit.log", stop_timeout=0.5))

    def containers() -> list[dict[str, Any]]:
        ids = docker.run("ps", "-q", "--filter", f"label={PREFIX}host").stdout.split()
        return [c for i in ids if (c := docker.inspect(i))]

    manager.systemctl("start", unit)
    g = Genready(manager, tmp_path, {"t": {"unit": unit, "url": f"http://127.0.0.1:{port}", **FAST}}).start()
    poller = ReadyPoller(g)
    try:
        first_pid = wait_for(lambda: ready(g), 60, "the first container verified")["pid"]
        (old,) = containers()
        assert record_of(g, first_pid)["served_by_pid"] == old["State"]["Pid"]
        poller.start()
        manager.systemctl("restart", unit)
        wait_for(lambda: "an old container" in g.log(), 20, "genready refusing the lingering old container")
        body = wait_for(lambda: ready(g), 30, "the new container verified")
        answers = poller.stop()
        new = next(c for c in containers() if c["Id"] != old["Id"])
        assert_no_false_ready(answers, left_active_at(manager, unit), created(new))
        assert record_of(g, body["pid"])["served_by_pid"] == new["State"]["Pid"]
    finally:
        poller.stop()
        g.stop()
        manager.systemctl("stop", unit)
        for c in containers():
            docker.run("rm", "-f", c["Id"], check=False)


def test_foreign_container_on_the_published_port_is_refused(manager: UserManager, docker: Docker,
                                                            tmp_path: Path) -> None:
    """A container started outside the unit holds the port: the unit's `docker run` cannot start,
    and the foreign container's answers never make the unit ready. Once it is gone, the unit's is."""
    unit, name, foreign, port = "tc-foreign.service", PREFIX + "own", PREFIX + "foreign", free_port()
    docker.run("run", "-d", *docker.simulate_args(foreign, port)[1:])
    wait_for(lambda: http(f"http://127.0.0.1:{port}/v1/models")[0] == 200, 30, "the foreign container answering")
    manager.install_unit(unit, docker.unit(name, port, log=tmp_path / "unit.log"))
    manager.systemctl("start", unit)
    g = Genready(manager, tmp_path, {"t": {"unit": unit, "url": f"http://127.0.0.1:{port}", **FAST}}).start()
    try:
        wait_for(lambda: "a foreign container" in g.log(), 30, "genready refusing the foreign container")
        assert ready(g) is None
        docker.run("rm", "-f", foreign)
        body = wait_for(lambda: ready(g), 60, "the unit's own container verified")
        own = docker.inspect(name)
        assert own is not None and record_of(g, body["pid"])["served_by_pid"] == own["State"]["Pid"]
    finally:
        g.stop()
        manager.systemctl("stop", unit)
        docker.run("rm", "-f", foreign, name, check=False)


def test_podman_conmon_main_pid(manager: UserManager, podman: Podman, tmp_path: Path) -> None:
    """podman run --sdnotify=conmon (what Quadlet generates): conmon is the MainPID, the server a
    descendant of it in the container's network namespace behind NAT. Both proofs accept it:
    "process" by following the NAT'd connection, "container" through podman's API."""
    unit, name, port = "tc-podman.service", PREFIX + "podman", free_port()
    manager.install_unit(unit, podman.unit(name, port, log=tmp_path / "unit.log",
                                           extra=("--sdnotify=conmon", "--cgroups=split", "-e", "INVOCATION_ID"),
                                           service="Type=notify\nNotifyAccess=all"))
    manager.systemctl("start", unit)
    target = {"unit": unit, "url": f"http://127.0.0.1:{port}", **FAST}
    g = Genready(manager, tmp_path, {"p": {**target, "owner": "process"},
                                     "c": {**target, "container_socket": podman.socket}}).start()
    try:
        main_pid, _ = show(manager, unit)
        assert Path(f"/proc/{main_pid}/comm").read_text().strip() == "conmon"
        wait_for(lambda: ready(g, "p") and ready(g, "c"), 60, "both targets verified")
        c = podman.inspect(name)
        assert c is not None
        assert record_of(g, main_pid, "p")["served_by_pid"] == c["State"]["Pid"]
        assert record_of(g, main_pid, "c")["served_by_pid"] == c["State"]["Pid"]
    finally:
        g.stop()
        manager.systemctl("stop", unit)


HARDENED_PROBE = r'''
"""Under genready.service's hardening: the container proof of one connection, as STATUS=."""
import json, socket, sys, time
from genready.probe.container import UnitStart, find_container_owner
from genready.systemd.notify import Notifier

port, name, since_us = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
out = {}
with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
    s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
    s.recv(65536)
    owner = find_container_owner(s.getsockname(), s.getpeername(), UnitStart(0, since_us), name)
    out = {"pid": owner.pid, "trusted": owner.trusted, "detail": owner.detail}
try:
    with open("/proc/net/nf_conntrack") as f:  # the NAT path (podman) reads this
        out["conntrack"] = bool(f.readline() or True)
except OSError as e:
    out["conntrack"] = repr(e)
Notifier().ready(status=json.dumps(out))
while True:
    time.sleep(1)
'''


def test_container_proof_under_the_shipped_hardening(manager: UserManager, docker: Docker, inaccessible_nodes: None,
                                                     tmp_path: Path) -> None:
    """genready.service's own sandbox (an unprivileged DynamicUser with CAP_SYS_PTRACE and
    CAP_DAC_READ_SEARCH, RestrictNamespaces=yes) lets the proof read another namespace's
    /proc/PID/net/tcp and the conntrack table (why it uses those, not setns), and, with
    docker.sock out of its reach, dockerd's own file about the container."""
    name, port = PREFIX + "hardened", free_port()
    since_us = int(time.time() * 1e6)
    docker.run("run", "-d", *docker.simulate_args(name, port)[1:])
    wait_for(lambda: http(f"http://127.0.0.1:{port}/v1/models")[0] == 200, 30, "the container answering")
    probe = tmp_path / "probe.py"
    probe.write_text(HARDENED_PROBE)
    unit = "tc-hardened.service"
    text = hardened_variant((UNITS / "genready.service").read_text(), probe_dir=tmp_path, manager=manager,
                            exec_start=f"{PY} {probe} {port} {name} {since_us}")
    manager.install_unit(unit, text)
    try:
        start = manager.systemctl("start", unit, check=False, timeout=30)
        log = (tmp_path / "out.log").read_text() if (tmp_path / "out.log").exists() else ""
        assert start.returncode == 0, start.stderr + log
        out = json.loads(manager.show(unit, "StatusText")["StatusText"])
        c = docker.inspect(name)
        assert c is not None
        assert out["trusted"] is True and out["pid"] == c["State"]["Pid"], out
        assert "docker-proxy" in out["detail"], out
        assert out["conntrack"] is True, out
    finally:
        manager.remove_unit(unit)
        docker.run("rm", "-f", name, check=False)


def test_docker_without_its_api_reads_dockerds_file(docker: Docker, tmp_path: Path) -> None:
    name = PREFIX + "files"
    docker.run("run", "-d", "-e", "INVOCATION_ID=abc", *docker.simulate_args(name, free_port())[1:])
    try:
        c = docker.inspect(name)
        assert c is not None
        seen = inspect("docker", c["Id"], str(tmp_path / "no.sock"))
        assert (seen.id, seen.name, seen.created_us) == (c["Id"], name, parse_time_us(c["Created"]))
        assert "INVOCATION_ID=abc" in seen.env
        with pytest.raises(EngineError, match=r"does not exist .*; and .*config\.v2\.json is unreadable"):
            inspect("docker", "0" * 64, str(tmp_path / "no.sock"))
    finally:
        docker.run("rm", "-f", name, check=False)


# --- the pieces, without an engine ----------------------------------------------------------------

CID = "3f2a" + "0123456789abcdef" * 3 + "012345678901"


@pytest.mark.parametrize(("cgroup", "expected"), [
    (f"0::/docker/{CID}\n", ("docker", CID)),  # dockerd's cgroupfs driver (these machines)
    (f"12:pids:/docker/{CID}\n1:name=systemd:/docker/{CID}\n0::/docker/{CID}\n", ("docker", CID)),
    (f"0::/system.slice/docker-{CID}.scope\n", ("docker", CID)),  # systemd driver
    (f"0::/machine.slice/libpod-{CID}.scope/container\n", ("podman", CID)),  # podman, nested subgroup
    (f"0::/libpod_parent/libpod-{CID}\n", ("podman", CID)),  # podman's cgroupfs manager
    (f"0::/system.slice/sglang.service/libpod-payload-{CID}\n", ("podman", CID)),  # --cgroups=split
    (f"0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{CID}.scope\n", ("podman", CID)),
    (f"0::/machine.slice/libpod-conmon-{CID}.scope\n", None),  # conmon is not the container
    ("0::/app.slice/sglang.service\n", None),
    (f"0::/docker-{CID[:12]}.scope\n", None),  # not a full id
])
def test_container_of_cgroup(cgroup: str, expected: tuple[str, str] | None) -> None:
    assert container_of_cgroup(cgroup) == expected


@pytest.mark.parametrize(("argv", "name"), [
    (["/usr/bin/docker", "run", "--rm", "--name", "sglang", "-p", "30000:30000", "img"], "sglang"),
    (["/usr/bin/podman", "run", "--name=sglang", "img"], "sglang"),
    (["/usr/bin/conmon", "--api-version", "1", "-c", CID, "-n", "systemd-sglang"], "systemd-sglang"),
    (["/usr/bin/docker", "run", "img", "--", "--name", "inner"], None),
    (["/usr/bin/docker", "run", "img"], None),
    ([], None),
])
def test_name_from_cmdline(argv: list[str], name: str | None) -> None:
    assert name_from_cmdline(argv) == name


def test_parse_time_us() -> None:
    base = int(datetime.datetime(2026, 12, 1, 6, 1, 15, tzinfo=UTC).timestamp()) * 10**6
    assert parse_time_us("2026-12-01T06:01:15.194190878Z") == base + 194190  # docker: ns, Z
    assert parse_time_us("2026-12-01T07:01:15.5+01:00") == base + 500000  # podman: an offset
    assert parse_time_us("2026-12-01T06:01:15Z") == base
    with pytest.raises(ValueError):
        parse_time_us("yesterday")


def _c(name: str = "sglang", created_us: int = 2_000_000, env: tuple[str, ...] = ()) -> Container:
    return Container("docker", CID, name, created_us, env)


def test_judge() -> None:
    start = UnitStart(4242, 1_000_000, "9f05091306134c968e0327f5410649e5")
    assert judge(_c(), start, "sglang") is None
    assert "an old container" in (judge(_c(created_us=999_999), start, "sglang") or "")
    assert "a foreign container" in (judge(_c(name="other"), start, "sglang") or "")
    assert "name is unknown" in (judge(_c(), start, None) or "")
    # Unnamed, but carrying the start's identity: trusted only for this very start.
    assert judge(_c(env=("INVOCATION_ID=9f05091306134c968e0327f5410649e5",)), start, None) is None
    assert "another start's" in (judge(_c(env=("INVOCATION_ID=00",)), start, None) or "")
    assert "no start time" in (judge(_c(), UnitStart(4242, 0), "sglang") or "")


def test_conmon_pins_its_container() -> None:
    argv = ["/usr/bin/conmon", "--api-version", "1", "-c", CID, "-u", CID, "-n", "sglang"]
    assert conmon_container(argv) == CID
    assert conmon_container(["/usr/bin/docker", "run", "-c", CID]) is None
    start = UnitStart(4242, 5_000_000, "9f05091306134c968e0327f5410649e5")
    # systemd moved ExecMainStartTimestamp to podman's MAINPID= message, after the container was
    # created: the monitored id decides, not the age.
    assert judge(_c(created_us=1), start, None, CID) is None
    other = Container("podman", "ab" * 32, "sglang", 6_000_000, ())
    assert "monitors container 3f2a" in (judge(other, start, None, CID) or "")


def test_conntrack_reply_names_the_translated_server_side(tmp_path: Path) -> None:
    table = tmp_path / "nf_conntrack"
    table.write_text(
        "ipv4     2 tcp      6 86399 ESTABLISHED src=127.0.0.1 dst=127.0.0.1 sport=50362 dport=30001 "
        "src=127.0.0.1 dst=127.0.0.1 sport=30001 dport=50362 [ASSURED] mark=0 zone=0 use=2\n"
        "ipv4     2 tcp      6 86399 ESTABLISHED src=127.0.0.1 dst=127.0.0.1 sport=50362 dport=30000 "
        "src=10.88.0.5 dst=10.88.0.1 sport=30000 dport=50362 [ASSURED] mark=0 zone=0 use=2\n")
    local, peer = ("127.0.0.1", 50362), ("127.0.0.1", 30000)
    assert conntrack_reply(local, peer, str(table)) == (("10.88.0.5", 30000), ("10.88.0.1", 50362))
    assert conntrack_reply(("127.0.0.1", 1), peer, str(table)) is None
    assert conntrack_reply(local, peer, str(tmp_path / "missing")) is None


def test_engine_socket_missing_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match=r"does not exist .*container_socket"):
        inspect("podman", CID, str(tmp_path / "podman.sock"))


def test_owner_keys_in_config() -> None:
    base = {"targets": {"t": {"unit": "s.service", "url": "http://127.0.0.1:1"}}}
    t = parse(base).targets["t"]
    assert (t.owner, t.container, t.container_socket) == ("process", "", "")
    t = parse({"targets": {"t": {**base["targets"]["t"], "owner": "container", "container": "sglang"}}}).targets["t"]
    assert (t.owner, t.container) == ("container", "sglang")
    with pytest.raises(ConfigError, match=r"targets\.t\.owner: expected one of 'process', 'container'"):
        parse({"targets": {"t": {**base["targets"]["t"], "owner": "docker"}}}, "g.toml")
    with pytest.raises(ConfigError, match=r"targets\.t\.container_socket: expected an absolute path"):
        parse({"targets": {"t": {**base["targets"]["t"], "container_socket": "docker.sock"}}}, "g.toml")
