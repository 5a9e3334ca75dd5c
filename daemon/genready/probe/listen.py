"""Watch, rather than probe, for a loading server to start listening on its port.

SGLang and vLLM bind their port only once the model is loaded: for minutes every probe is
refused. A probe costs two systemd reads and a connection attempt; a sock_diag dump of the
host's LISTEN sockets costs a fraction of that. So after a refused probe the gate asks this
module to wait: it looks every WATCH_INTERVAL for a LISTEN socket on the target's port held by
the unit's MainPID or a descendant, and returns the moment one appears, so a server that was
refusing is probed within one watch interval of its listen(). Whatever the watch sees, the
probe still proves everything itself; the watch only decides *when* to probe.

It falls back to the schedule's plain delay when it cannot see the port: a target on another
host, a URL that is not host:port, a server in a container (owner = "container", or a process
of the unit in another network namespace, reached through NAT), or a host without sock_diag
(reading /proc/net/tcp instead costs milliseconds, more than the probe it would save). And
while watching, a probe still goes out every `cap` seconds, in case the server listens where
this namespace cannot see.

The same table answers a second question, while a start is verified and while it is probed: does
anyone *else* listen where the target's clients connect? A process outside the unit's current start
(not the MainPID or a descendant) that binds the target's port with SO_REUSEPORT after the
verification gets a share of new connections (the kernel spreads them); one that binds an address
the url also resolves to (`localhost` is ::1 and 127.0.0.1, a server often listens on one) gets the
connections made to it. One probe proves one connection only, so `strangers` looks: every LISTEN
socket on the port that a connection to one of the url's addresses can reach (the kernel's lookup:
listeners on exactly that address first, else on the wildcard) and that the unit does not hold is a
stranger, named by its holder. The gate (rule/gate.py) looks after each successful probe and every
STRANGER_CHECK seconds while ready, and revokes readiness while one is there. It does not see
SO_BINDTODEVICE, BPF socket lookup programs, or a listener that comes and goes between two looks.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Final

from genready.probe import owner
from genready.reach import Endpoint

log = logging.getLogger("genready.probe.listen")

WATCH_INTERVAL: Final = 0.1  # seconds between looks at the port while nothing listens
# Every loading target looks WATCH_INTERVAL apart; one dump of the host's LISTEN sockets
# serves all looks within SHARED_FOR of it, so 200 loading targets cost ~1/SHARED_FOR dumps a
# second instead of 2,000. It delays noticing a listen() by at most this much.
SHARED_FOR: Final = 0.02
# Seconds between looks for strangers on the target's addresses while it is ready: how late a second
# listener is noticed (the look itself is one shared sock_diag dump, plus one fd scan per new socket).
STRANGER_CHECK: Final = 1.0
_ANY4: Final = ipaddress.IPv4Address("0.0.0.0")
_ANY6: Final = ipaddress.IPv6Address("::")


class _ListenTable:
    """The host's LISTEN sockets, dumped at most once per SHARED_FOR for every target's watch."""

    def __init__(self) -> None:
        self._at = float("-inf")
        self._rows: list[owner.TcpRow] = []

    def on_port(self, port: int) -> list[owner.TcpRow]:
        """The LISTEN sockets on `port`; OSError when sock_diag is unusable."""
        now = time.monotonic()
        if now - self._at >= SHARED_FOR:
            self._rows, self._at = owner.all_listeners(), now
        return owner.listeners(port, self._rows)


_TABLE = _ListenTable()  # one per process: sock_diag answers for the whole network namespace


@dataclass(frozen=True)
class Stranger:
    """A LISTEN socket on the target's port, reachable at one of its url's addresses, held by a
    process outside the unit's current start."""

    pid: int
    comm: str  # the holder's command name ("" if it is gone)
    uid: int  # the socket's owner uid, as the kernel lists it
    address: str  # where it listens: "::1", "0.0.0.0"
    port: int
    detail: str  # owner.py's words on the holder

    def __str__(self) -> str:
        where = f"[{self.address}]" if ":" in self.address else self.address
        return (f"a second listener on {where}:{self.port}, uid {self.uid}: {self.detail}; the kernel hands it "
                "connections made to the target's url")

    def to_json(self) -> dict[str, object]:
        return {"pid": self.pid, "comm": self.comm, "uid": self.uid, "address": self.address, "port": self.port}


def reach(rows: list[owner.TcpRow], addresses: list[ipaddress.IPv4Address | ipaddress.IPv6Address]
          ) -> list[owner.TcpRow]:
    """The LISTEN sockets of `rows` (all on one port) that a connection to one of `addresses` can
    reach, as the kernel looks them up (__inet_lookup_listener): the listeners bound to exactly that
    address (several with SO_REUSEPORT), else those on 0.0.0.0, else those on `::` that take IPv4
    too (not IPV6_V6ONLY); for an IPv6 address, those on `::`."""
    out: list[owner.TcpRow] = []
    for a in addresses:
        exact = [r for r in rows if owner.kernel_ip(r.local[0]) == a]
        if not exact:
            ip6 = [r for r in rows if owner.kernel_ip(r.local[0]) == _ANY6 and (a.version == 6 or r.v6only is not True)]
            ip4 = [r for r in rows if owner.kernel_ip(r.local[0]) == _ANY4] if a.version == 4 else []
            exact = ip4 or ip6
        out += [r for r in exact if r not in out]
    return out


def _addresses(host: str, port: int) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """What the url's host resolves to, as clients resolve it (getaddrinfo: /etc/hosts for localhost)."""
    try:
        return [owner.kernel_ip(host)]
    except ValueError:
        pass
    found: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = []
    for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP):
        ip = owner.kernel_ip(str(info[4][0]))
        if ip not in found:
            found.append(ip)
    return found


def _is_local_host(host: str) -> bool:
    """Is `host` an address of this machine (so its listening sockets are ours to see)? No DNS:
    a name other than localhost counts as remote."""
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if ip.is_loopback or ip.is_unspecified:
        return True
    family = socket.AF_INET if ip.version == 4 else socket.AF_INET6
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.bind((host, 0))  # succeeds only for one of our own addresses
        except OSError:
            return False
    return True


def _netns(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def in_our_netns(main_pid: int) -> bool:
    """Do the MainPID and all its descendants share genready's network namespace? A server in
    another one listens where sock_diag here cannot see it."""
    ours = _netns("self")
    if ours is None:
        return False
    return all(_netns(pid) in (ours, None) for pid in (main_pid, *owner.descendants(main_pid)))


def port_of(ep: Endpoint) -> int | None:
    """The TCP port of a target on this host, or None when the watch cannot apply."""
    if ep.unix_path is not None or not _is_local_host(ep.host):
        return None
    return ep.port


class ListenWatch:
    """Is the unit's server listening on the target's port yet? One per target."""

    def __init__(self, ep: Endpoint, *, enabled: bool = True) -> None:
        self.port = port_of(ep) if enabled else None
        self.host = ep.host
        self.looks = 0  # sock_diag dumps made (for the bench and tests)
        self._pid = 0
        self._mine: dict[int, bool | None] = {}  # inode -> owner.unit_holds(inode, self._pid)
        self._held: dict[int, owner.Owner] = {}  # inode -> owner.socket_owner(inode, self._pid)
        self._ours: bool | None = None  # in_our_netns(self._pid), asked once per start: a thread hop each look
        self._addrs: list[ipaddress.IPv4Address | ipaddress.IPv6Address] | None = None

    @property
    def usable(self) -> bool:
        return self.port is not None

    async def listening(self, main_pid: int) -> tuple[bool, bool]:
        """(anything listens on the port, a listener is the unit's or cannot be told apart)."""
        assert self.port is not None
        self.looks += 1
        try:
            rows = _TABLE.on_port(self.port)
        except OSError as e:
            log.info("cannot watch port %d for listeners (%s): probing on the plain schedule instead", self.port, e)
            self.port = None
            return True, True
        self._same_start(main_pid)
        ours = False
        for row in rows:
            if row.inode not in self._mine:
                # One fd scan of the unit's processes per new listening socket, then remembered;
                # in a thread, as a server with many processes and fds can take milliseconds.
                self._mine[row.inode] = await asyncio.to_thread(owner.unit_holds, row.inode, main_pid)
            ours = ours or self._mine[row.inode] is not False
        return bool(rows), ours

    def _same_start(self, main_pid: int) -> None:
        if main_pid != self._pid:  # what was the unit's, or not, was so for another start
            self._pid, self._mine, self._held, self._ours = main_pid, {}, {}, None

    async def strangers(self, main_pid: int) -> list[Stranger]:
        """The listeners outside the unit's current start that connections to the target's url can
        reach (see the module's doc); [] where this cannot be seen (not a local TCP target, a server
        in another network namespace, no sock_diag): the probe's own proof is all there is there."""
        if self.port is None or main_pid <= 0:
            return []
        self._same_start(main_pid)
        if self._ours is None:
            self._ours = await asyncio.to_thread(in_our_netns, main_pid)
        if not self._ours:
            return []
        port = self.port
        self.looks += 1
        try:
            if self._addrs is None:
                self._addrs = await asyncio.to_thread(_addresses, self.host, port)
            rows = _TABLE.on_port(port)
        except OSError as e:
            if e.errno not in owner.DIAG_UNAVAILABLE:
                # Passing (genready out of fds or buffers, a resolver hiccup): this look is lost, not the next.
                log.debug("cannot look for other listeners on port %d now (%s)", port, e)
                return []
            log.info("cannot look for other listeners on port %d (%s): the probe's proof is all there is", port, e)
            self.port = None
            return []
        found: list[Stranger] = []
        for row in reach(rows, self._addrs):
            held = self._held.get(row.inode)
            if held is None:
                # One /proc scan per new socket, then remembered: an inode names one socket while it lives.
                held = self._held[row.inode] = await asyncio.to_thread(owner.socket_owner, row.inode, main_pid)
            if held.pid is not None and not held.trusted:
                st = owner.comm_ppid(held.pid)
                found.append(Stranger(held.pid, st[0] if st else "", row.uid, str(owner.kernel_ip(row.local[0])), port,
                                      held.detail))
        if len(self._held) > 64:  # sockets that closed: keep only those listening now
            live = {r.inode for r in rows}
            self._held = {i: o for i, o in self._held.items() if i in live}
        return found

    async def until_alone(self, main_pid: int, cap: float) -> None:
        """Wait until no stranger listens on the target's addresses, at most `cap` seconds: after a
        probe refused for one, the next probe follows its going within WATCH_INTERVAL."""
        deadline = time.monotonic() + cap
        while (left := deadline - time.monotonic()) > 0:
            await asyncio.sleep(min(WATCH_INTERVAL, left))
            if not await self.strangers(main_pid):
                return

    async def pause(self, delay: float, main_pid: int, cap: float) -> None:
        """Wait before the next probe after a refused one: `delay` if something listens already
        (the refusal came from it), else until a listener of the unit's appears, at most `cap`."""
        if not self.usable or not await asyncio.to_thread(in_our_netns, main_pid):
            await asyncio.sleep(delay)
            return
        anything, _ = await self.listening(main_pid)
        if anything:
            await asyncio.sleep(delay)
            return
        deadline = time.monotonic() + max(delay, cap)
        while (left := deadline - time.monotonic()) > 0:
            await asyncio.sleep(min(WATCH_INTERVAL, left))
            if not self.usable or (await self.listening(main_pid))[1]:
                return
