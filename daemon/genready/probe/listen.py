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
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import socket
import time
from typing import Final

from genready.probe import owner
from genready.reach import Endpoint

log = logging.getLogger("genready.probe.listen")

WATCH_INTERVAL: Final = 0.1  # seconds between looks at the port while nothing listens
# Every loading target looks WATCH_INTERVAL apart; one dump of the host's LISTEN sockets
# serves all looks within SHARED_FOR of it, so 200 loading targets cost ~1/SHARED_FOR dumps a
# second instead of 2,000. It delays noticing a listen() by at most this much.
SHARED_FOR: Final = 0.02


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
        self.looks = 0  # sock_diag dumps made (for the bench and tests)
        self._pid = 0
        self._mine: dict[int, bool | None] = {}  # inode -> owner.unit_holds(inode, self._pid)

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
        if main_pid != self._pid:
            self._pid, self._mine = main_pid, {}
        ours = False
        for row in rows:
            if row.inode not in self._mine:
                # One fd scan of the unit's processes per new listening socket, then remembered;
                # in a thread, as a server with many processes and fds can take milliseconds.
                self._mine[row.inode] = await asyncio.to_thread(owner.unit_holds, row.inode, main_pid)
            ours = ours or self._mine[row.inode] is not False
        return bool(rows), ours

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
