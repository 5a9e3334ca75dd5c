"""listen.py and owner.listeners against real sockets and real processes.

The watch decides only when the next probe goes out; these tests check that it sees a
listener appear (and whose it is), and that it falls back to the plain delay when it cannot see.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from genready import compat
from genready.probe import listen, owner
from genready.probe.listen import ListenWatch, in_our_netns, port_of
from genready.reach import endpoint
from genready_dev.harness import await_for, free_port, wait_for

# A process that listens on a port it prints, until its stdin closes.
LISTENER = """
import socket, sys
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
print(s.getsockname()[1], flush=True)
sys.stdin.read()
"""


@pytest.fixture(autouse=True)
def fresh_listen_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees the host's LISTEN sockets as they are: the process-wide table serves a dump
    for SHARED_FOR (20 ms), and the previous test's last dump can be younger than this test's
    listener (a pause then took a foreign listener for none and waited out its cap)."""
    monkeypatch.setattr(listen, "_TABLE", listen._ListenTable())


@pytest.fixture
def foreign_listener() -> Iterator[tuple[int, int]]:
    """(pid, port) of a listener in a child process: not a descendant of any other child."""
    p = subprocess.Popen([sys.executable, "-c", LISTENER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None
        yield p.pid, int(p.stdout.readline())
    finally:
        p.kill()
        p.wait(10)


@pytest.fixture
def bystander() -> Iterator[int]:
    """The pid of an unrelated process, standing in for a unit's MainPID that does not listen."""
    p = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        yield p.pid
    finally:
        p.kill()
        p.wait(10)


@pytest.mark.parametrize(("url", "watchable"), [
    ("http://127.0.0.1:30000", True),
    ("http://localhost:8080/v1", True),
    ("http://[::1]:30000", True),
    ("http://0.0.0.0:30000", True),
    ("http://127.0.0.1", True),  # port 80
    ("http://192.0.2.1:30000", False),  # TEST-NET: not an address of this host
    ("http://gpu-box.example:30000", False),  # a name: no DNS here, so not known to be local
    ("unix:/run/vllm.sock", False),
])
def test_only_targets_on_this_host_are_watched(url: str, watchable: bool) -> None:
    assert (port_of(endpoint(url)) is not None) is watchable


def test_listeners_sees_ipv4_and_ipv6_listeners_and_agrees_with_proc() -> None:
    with socket.socket() as s4, socket.socket(socket.AF_INET6) as s6, socket.socket() as connected:
        s4.bind(("127.0.0.1", 0))
        port = s4.getsockname()[1]
        assert owner.listeners(port) == []  # bound, not yet listening
        s4.listen()
        s6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            s6.bind(("::1", port))
            s6.listen()
            want = {("127.0.0.1", port), ("::1", port)}
        except OSError:  # no IPv6 loopback here
            want = {("127.0.0.1", port)}
        connected.connect(("127.0.0.1", port))  # an established socket on the port is no listener
        rows = owner.listeners(port)
        assert {r.local for r in rows} == want
        assert all(r.state == 10 and r.inode > 0 for r in rows)
        # /proc/net/tcp6 has no IPV6_V6ONLY column: compare the rest.
        diag = [dataclasses.replace(r, v6only=None) for r in rows]
        assert sorted(diag, key=lambda r: r.inode) == sorted(owner.proc_listeners(port), key=lambda r: r.inode)
        assert owner.listeners(port + 1 if port < 65535 else port - 1) == []


@pytest.mark.system
def test_unit_holds_tells_the_unit_s_listener_from_a_foreign_one(foreign_listener: tuple[int, int],
                                                                  bystander: int) -> None:
    pid, port = foreign_listener
    (row,) = owner.listeners(port)
    assert owner.unit_holds(row.inode, pid) is True  # the main pid itself
    assert owner.unit_holds(row.inode, os.getpid()) is True  # a descendant of the main pid
    assert owner.unit_holds(row.inode, bystander) is False
    assert owner.unit_holds(row.inode, 0) is None  # no main pid: cannot tell


async def test_pause_returns_when_the_unit_starts_listening() -> None:
    port = free_port()
    watch = ListenWatch(endpoint(f"http://127.0.0.1:{port}"))
    pause = asyncio.ensure_future(watch.pause(0.01, os.getpid(), cap=60))
    await await_for(lambda: watch.looks >= 3, 10, "a few looks at the port", interval=0.005)
    assert not pause.done()  # nothing listens: it keeps watching
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        t0 = time.monotonic()
        await compat.wait_for(pause, 10)  # far below the cap of 60 s
    assert time.monotonic() - t0 < 10


@pytest.mark.system
async def test_pause_waits_out_the_cap_while_only_a_foreign_process_listens(foreign_listener: tuple[int, int],
                                                                            bystander: int) -> None:
    _, port = foreign_listener
    watch = ListenWatch(endpoint(f"http://127.0.0.1:{port}"))
    # Something listens already at the start: the refusal came from it, so the plain delay applies.
    t0 = time.monotonic()
    await compat.wait_for(watch.pause(0.05, bystander, cap=60), 10)
    assert time.monotonic() - t0 < 10 and watch.looks == 1


@pytest.mark.system
async def test_pause_ignores_a_foreign_listener_that_appears_and_probes_after_the_cap(bystander: int) -> None:
    port = free_port()
    watch = ListenWatch(endpoint(f"http://127.0.0.1:{port}"))
    started = time.monotonic()
    pause = asyncio.ensure_future(watch.pause(0.01, bystander, cap=2.0))
    await await_for(lambda: watch.looks >= 1, 10, "the first look at the port", interval=0.005)
    with socket.socket() as s:  # held by this process: not the bystander's
        s.bind(("127.0.0.1", port))
        s.listen()
        looks_before = watch.looks
        await compat.wait_for(pause, 10)
        looks_with_it = watch.looks - looks_before
    # It saw the foreign listener (looked at least twice while it was there) and kept waiting for the
    # unit's own, up to the cap, counted from the pause's start: no bound on how fast this machine is.
    assert looks_with_it >= 2 and time.monotonic() - started >= 2.0, (looks_with_it, time.monotonic() - started)


async def test_pause_is_a_plain_sleep_for_a_target_it_cannot_see() -> None:
    watch = ListenWatch(endpoint("http://192.0.2.1:30000"))
    assert not watch.usable
    await compat.wait_for(watch.pause(0.01, os.getpid(), cap=60), 10)
    assert watch.looks == 0


@pytest.mark.system
def test_a_unit_with_a_process_in_another_network_namespace_is_not_watched() -> None:
    assert in_our_netns(os.getpid())
    # A child in its own network namespace, as a container's server reached through NAT would be.
    p = subprocess.Popen(["unshare", "--net", "sh", "-c", "sleep 60"], stdin=subprocess.DEVNULL)
    try:
        # Our process with its descendants: false once unshare has switched namespaces.
        wait_for(lambda: not in_our_netns(os.getpid()), 10, "the child to leave our network namespace",
                 interval=0.01)
    finally:
        p.kill()
        p.wait(10)


async def test_owner_container_targets_are_not_watched() -> None:
    watch = ListenWatch(endpoint(f"http://127.0.0.1:{free_port()}"), enabled=False)
    assert not watch.usable
    await compat.wait_for(watch.pause(0.01, os.getpid(), cap=60), 10)
    assert watch.looks == 0


# --- strangers: someone else listening where the url connects ------------------------------------

def _row(addr: str, inode: int, v6only: bool | None = None) -> owner.TcpRow:
    return owner.TcpRow((addr, 30000), ("0.0.0.0" if ":" not in addr else "::", 0), 10, 0, inode, v6only)


@pytest.mark.parametrize(("rows", "addresses", "reached"), [
    # SO_REUSEPORT: two sockets on exactly the target's address share its connections.
    ([("127.0.0.1", 1), ("127.0.0.1", 2)], ["127.0.0.1"], [1, 2]),
    # localhost: the server on 127.0.0.1 only; whoever binds [::1] gets the connections to ::1.
    ([("127.0.0.1", 1), ("::1", 2)], ["::1", "127.0.0.1"], [2, 1]),
    # An exact address wins over the wildcard: a foreign 0.0.0.0 takes none of 127.0.0.1's.
    ([("127.0.0.1", 1), ("0.0.0.0", 2)], ["127.0.0.1"], [1]),
    # ...but takes them all when nobody listens on exactly that address.
    ([("0.0.0.0", 1)], ["127.0.0.1"], [1]),
    # :: takes IPv4 connections too, unless it is IPV6_V6ONLY; 0.0.0.0 wins over it.
    ([("::", 1, False)], ["127.0.0.1"], [1]),
    ([("::", 1, True)], ["127.0.0.1"], []),
    ([("0.0.0.0", 1), ("::", 2, False)], ["127.0.0.1"], [1]),
    ([("::", 1, True), ("0.0.0.0", 2)], ["::1"], [1]),
    # A dual-stack socket bound to the IPv4-mapped address is that IPv4 address.
    ([("::ffff:127.0.0.1", 1)], ["127.0.0.1"], [1]),
], ids=["reuseport", "localhost-v6-squatter", "exact-beats-wildcard", "wildcard-when-alone", "dual-stack",
        "v6only", "v4-wildcard-first", "v6-wildcard", "v4-mapped"])
def test_reach_follows_the_kernels_listener_lookup(rows: list[tuple[Any, ...]], addresses: list[str],
                                                    reached: list[int]) -> None:
    table = [_row(*r) for r in rows]
    assert [r.inode for r in listen.reach(table, [owner.kernel_ip(a) for a in addresses])] == reached


@pytest.mark.system
async def test_strangers_names_a_second_listener_on_the_port_and_not_the_units_own() -> None:
    port = free_port()
    code = ("import socket, sys\n"
            "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)\n"
            f"s.bind(('127.0.0.1', {port})); s.listen(); print('up', flush=True); sys.stdin.read()\n")
    unit = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    stranger = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True)
    try:
        for p in (unit, stranger):
            assert p.stdout is not None and p.stdout.readline() == "up\n"
        watch = ListenWatch(endpoint(f"http://127.0.0.1:{port}"))
        found = await watch.strangers(unit.pid)
        assert [s.pid for s in found] == [stranger.pid], found
        assert found[0].address == "127.0.0.1" and found[0].port == port and found[0].comm.startswith("python")
        assert f"pid {stranger.pid} is not main pid {unit.pid}" in str(found[0])
        # The stranger's own view: the unit's socket is the foreign one.
        assert [s.pid for s in await watch.strangers(stranger.pid)] == [unit.pid]
        stranger.kill()
        stranger.wait(10)
        listen._TABLE = listen._ListenTable()  # a new dump: the table serves one for SHARED_FOR
        assert await watch.strangers(unit.pid) == []
    finally:
        for p in (unit, stranger):
            p.kill()
            p.wait(10)


@pytest.mark.system
async def test_localhost_leaves_the_other_address_to_a_stranger(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server listens on 127.0.0.1; another process takes [::1] at the same port: for a url
    with `localhost` (both addresses) that is a stranger, for a url with 127.0.0.1 it is not."""
    with socket.socket() as server, socket.socket(socket.AF_INET6) as squatter:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        squatter.bind(("::1", port))
        squatter.listen()
        # The unit: a child holding the server's socket; the squatter stays here, outside its tree.
        unit = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                                pass_fds=(server.fileno(),))
        server.close()
        try:
            assert await ListenWatch(endpoint(f"http://127.0.0.1:{port}")).strangers(unit.pid) == []
            names = socket.getaddrinfo("localhost", port, type=socket.SOCK_STREAM)
            if not {i[0] for i in names} >= {socket.AF_INET, socket.AF_INET6}:
                # This host's /etc/hosts names 127.0.0.1 only: resolve as Debian's (::1 and 127.0.0.1) does.
                monkeypatch.setattr(listen, "_addresses",
                                    lambda host, port: [owner.kernel_ip("::1"), owner.kernel_ip("127.0.0.1")])
            found = await ListenWatch(endpoint(f"http://localhost:{port}")).strangers(unit.pid)
            assert [(s.pid, s.address) for s in found] == [(os.getpid(), "::1")]
        finally:
            unit.kill()
            unit.wait(10)


@pytest.mark.parametrize(("err", "usable_after"), [(errno.EMFILE, True), (errno.EPERM, False)])
async def test_a_passing_error_loses_one_look_and_sock_diag_refused_ends_them(
        monkeypatch: pytest.MonkeyPatch, err: int, usable_after: bool) -> None:
    """Out of fds for a moment (EMFILE): that look finds nothing and the next one looks again; sock_diag
    refused (EPERM: seccomp, an LSM) for good: no more looks, the probe's proof is what is left."""
    def refuse() -> list[owner.TcpRow]:
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(owner, "all_listeners", refuse)
    watch = ListenWatch(endpoint("http://127.0.0.1:30000"))
    assert await watch.strangers(os.getpid()) == []
    assert watch.usable is usable_after
