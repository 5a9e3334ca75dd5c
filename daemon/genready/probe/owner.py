"""Who holds the server side of a TCP connection: proof that an answer came from the unit.

Our client socket's (local, peer) pair names exactly one server-side socket on this host: the
one whose local address is our peer and whose remote address is our local. Its inode (0 until
the server has accept()ed) is what /proc/PID/fd/N links to as `socket:[INODE]`, so the PID
holding that fd is the process that answered. It is trusted only if it is the unit's MainPID
or a descendant of it: leftover processes of an old start can keep a port alive.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import struct
import sys
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Final

Addr = tuple[str, int]
_IP = ipaddress.IPv4Address | ipaddress.IPv6Address

# Kernel TCP states (include/net/tcp_states.h); /proc/net/tcp and sock_diag share them.
TCP_STATES: Final = {
    1: "ESTABLISHED", 2: "SYN_SENT", 3: "SYN_RECV", 4: "FIN_WAIT1", 5: "FIN_WAIT2", 6: "TIME_WAIT",
    7: "CLOSE", 8: "CLOSE_WAIT", 9: "LAST_ACK", 10: "LISTEN", 11: "CLOSING", 12: "NEW_SYN_RECV",
}
_OPEN_STATES: Final = frozenset({1, 3, 8, 12})  # inode 0 here means "not accept()ed yet"

_CAP_DAC_OVERRIDE: Final = 1
_CAP_DAC_READ_SEARCH: Final = 2
_CAP_SYS_PTRACE: Final = 19

_NETLINK_SOCK_DIAG: Final = 4
_SOCK_DIAG_BY_FAMILY: Final = 20
_NLMSG_ERROR: Final = 2
_NLM_F_REQUEST: Final = 1
_INET_DIAG_NOCOOKIE: Final = 0xFFFFFFFF
_NLMSG_HDR: Final = struct.Struct("=IHHII")
_DIAG_REQ_HEAD: Final = struct.Struct("=BBBBI")
_DIAG_MSG_HEAD: Final = struct.Struct("=BBBB")
_DIAG_MSG_TAIL: Final = struct.Struct("=IIIII")  # expires, rqueue, wqueue, uid, inode


@dataclass(frozen=True)
class Owner:
    """Who holds the server side of a connection, and whether that proves the unit answered."""

    pid: int | None  # who holds the server side, None if not found
    trusted: bool  # pid is main_pid or a descendant of it
    detail: str  # human text: "pid 4242 (main)", "not accepted yet", …


@dataclass(frozen=True)
class TcpRow:
    """One TCP socket as the kernel lists it: addresses as (ip text, port), state, uid, inode."""

    local: Addr
    remote: Addr
    state: int
    uid: int
    inode: int
    # An IPv6 socket's IPV6_V6ONLY (sock_diag's INET_DIAG_SKV6ONLY), None when not known: a `::`
    # listener without it takes IPv4 connections too (probe/listen.py's reach).
    v6only: bool | None = None


# --- addresses ----------------------------------------------------------------------------------

def kernel_ip(host: str) -> _IP:
    """An address as the kernel's socket tables hold it: no scope, an IPv4-mapped IPv6 one as IPv4."""
    # getsockname() gives "fe80::1%eth0" for scoped addresses; the kernel tables carry no scope.
    ip = ipaddress.ip_address(host.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped  # a dual-stack server sees an IPv4 client as ::ffff:a.b.c.d
    return ip


def decode_hex_addr(text: str) -> Addr:
    """'0100007F:1F90' -> ('127.0.0.1', 8080); 32-hex-digit IPv6 too. ValueError if malformed.

    The kernel prints each 32-bit word of the address as a host-order integer, so the bytes of
    each word come out reversed on little-endian machines; the port is plain big-endian hex.
    """
    host, _, port = text.partition(":")
    if len(host) not in (8, 32) or len(port) != 4:
        raise ValueError(f"not a /proc/net/tcp address: {text!r}")
    raw = b"".join(int(host[i:i + 8], 16).to_bytes(4, sys.byteorder) for i in range(0, len(host), 8))
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw)), int(port, 16)
    ip6 = ipaddress.IPv6Address(raw)
    # Python < 3.13 writes ::ffff:7f00:1; spell mapped addresses the way everything else does.
    text = f"::ffff:{ip6.ipv4_mapped}" if ip6.ipv4_mapped is not None else str(ip6)
    return text, int(port, 16)


def encode_hex_addr(addr: Addr, *, v6: bool = False) -> str:
    """The inverse of decode_hex_addr; v6=True writes an IPv4 address as ::ffff:a.b.c.d."""
    ip = ipaddress.ip_address(addr[0].split("%", 1)[0])
    if v6 and isinstance(ip, ipaddress.IPv4Address):
        ip = ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + ip.packed)
    raw = ip.packed
    words = (int.from_bytes(raw[i:i + 4], sys.byteorder) for i in range(0, len(raw), 4))
    return "".join(f"{w:08X}" for w in words) + f":{addr[1]:04X}"


def parse_tcp_line(line: str) -> TcpRow:
    """One data line of /proc/net/tcp or /proc/net/tcp6; ValueError if it is not one."""
    f = line.split()
    if len(f) < 10 or not f[0].endswith(":"):
        raise ValueError(f"not a /proc/net/tcp line: {line!r}")
    return TcpRow(decode_hex_addr(f[1]), decode_hex_addr(f[2]), int(f[3], 16), int(f[7]), int(f[9]))


# --- finding the socket -------------------------------------------------------------------------

# sock_diag answers an exact 4-tuple lookup in ~15 µs; reading /proc/net/tcp costs ~1.8 ms even
# when nearly empty (the kernel walks its whole hash table) and grows with the connection count.
# So the netlink lookup comes first and /proc/net/tcp is the fallback (no tcp_diag, seccomp, …).
_diag_broken = False
# Errors that say sock_diag cannot work in this process at all, so it is not tried again:
# EPERM/EACCES (seccomp, an LSM), EAFNOSUPPORT (a unit's RestrictAddressFamilies= without
# AF_NETLINK), EPROTONOSUPPORT (a kernel without NETLINK_SOCK_DIAG).
DIAG_UNAVAILABLE: Final = frozenset({errno.EPERM, errno.EACCES, errno.EAFNOSUPPORT, errno.EPROTONOSUPPORT})


def _diag_ask(req: bytes, seq: int) -> bytes:
    """One sock_diag request (`req`: its family's request struct) and the kernel's first answer datagram."""
    msg = _NLMSG_HDR.pack(_NLMSG_HDR.size + len(req), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, seq, 0) + req
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(1.0)  # the kernel answers synchronously; this only guards against a wedge
        nl.sendto(msg, (0, 0))
        return nl.recv(8192)


def _diag_row(local: _IP, lport: int, remote: _IP, rport: int) -> TcpRow | None:
    """The socket with this exact local/remote pair via NETLINK_SOCK_DIAG; None if not found.

    Raises OSError when sock_diag itself is unusable; ENOENT is ambiguous (no such socket, or
    no tcp_diag module) so the caller double-checks a miss in /proc/net/tcp.
    """
    family = socket.AF_INET if isinstance(local, ipaddress.IPv4Address) else socket.AF_INET6
    sockid = (struct.pack(">HH", lport, rport) + local.packed.ljust(16, b"\0")
              + remote.packed.ljust(16, b"\0") + struct.pack("=III", 0, _INET_DIAG_NOCOOKIE, _INET_DIAG_NOCOOKIE))
    req = _DIAG_REQ_HEAD.pack(family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sockid
    seq = 1
    data = _diag_ask(req, seq)
    _, mtype, _, rseq, _ = _NLMSG_HDR.unpack_from(data)
    if mtype == _NLMSG_ERROR:
        err = -struct.unpack_from("=i", data, _NLMSG_HDR.size)[0]
        if err == errno.ENOENT:
            return None
        raise OSError(err, os.strerror(err))
    off = _NLMSG_HDR.size
    if mtype != _SOCK_DIAG_BY_FAMILY or rseq != seq or len(data) < off + 4 + 48 + _DIAG_MSG_TAIL.size:
        raise OSError(errno.EPROTO, "unexpected sock_diag reply")
    _, state, _, _ = _DIAG_MSG_HEAD.unpack_from(data, off)
    # Only the ports are compared: a dual-stack socket answers with ::ffff:a.b.c.d addresses.
    if data[off + 4:off + 8] != sockid[:4]:
        raise OSError(errno.EPROTO, "sock_diag answered for another socket")
    _, _, _, uid, inode = _DIAG_MSG_TAIL.unpack_from(data, off + 4 + 48)
    return TcpRow((str(local), lport), (str(remote), rport), state, uid, inode)


def _proc_rows(local: _IP, lport: int, remote: _IP, rport: int, net_dir: str = "/proc/net") -> Iterator[TcpRow]:
    """Rows of /proc/net/tcp{,6} whose local/remote match, found by text search, not by parsing
    every line: the file can hold tens of thousands of rows on a busy server."""
    pairs: list[tuple[str, str]] = []
    if isinstance(local, ipaddress.IPv4Address):
        pairs.append((f"{net_dir}/tcp", f" {encode_hex_addr((str(local), lport))}"
                                        f" {encode_hex_addr((str(remote), rport))} "))
    pairs.append((f"{net_dir}/tcp6", f" {encode_hex_addr((str(local), lport), v6=True)}"
                                    f" {encode_hex_addr((str(remote), rport), v6=True)} "))
    for path, key in pairs:
        try:
            with open(path, encoding="ascii") as f:
                text = f.read()
        except OSError:
            continue  # no IPv6 in this kernel, for instance
        start = text.find(key)
        while start >= 0:
            line_start = text.rfind("\n", 0, start) + 1
            line_end = text.find("\n", start)
            yield parse_tcp_line(text[line_start:line_end if line_end >= 0 else len(text)])
            start = text.find(key, start + 1)


def find_tcp_row(local: Addr, remote: Addr, *, use_diag: bool = True, net_dir: str = "/proc/net") -> TcpRow | None:
    """The socket on this host whose own addresses are exactly (local, remote), or None.

    Prefers a live socket over a TIME_WAIT leftover of the same 4-tuple. use_diag=False reads
    /proc/net/tcp{,6} only. net_dir="/proc/PID/net" looks in PID's network namespace instead
    (sock_diag only sees our own namespace, so that reads the files).
    """
    use_diag = use_diag and net_dir == "/proc/net"
    global _diag_broken
    lip, rip = kernel_ip(local[0]), kernel_ip(remote[0])
    if type(lip) is not type(rip):
        return None
    if use_diag and not _diag_broken:
        try:
            row = _diag_row(lip, int(local[1]), rip, int(remote[1]))
        except OSError as e:
            # Don't pay for an attempt that cannot succeed again; other errors may be transient.
            if e.errno in DIAG_UNAVAILABLE:
                _diag_broken = True
        else:
            if row is not None:
                return row
    best: TcpRow | None = None
    for row in _proc_rows(lip, int(local[1]), rip, int(remote[1]), net_dir):
        if row.inode != 0:
            return row
        best = best or row
    return best


_NLM_F_DUMP: Final = 0x300
_NLMSG_DONE: Final = 3
_TCP_LISTEN: Final = 10
_INET_DIAG_SKV6ONLY: Final = 11  # an attribute after inet_diag_msg: one byte, IPV6_V6ONLY
_RTA_HDR: Final = struct.Struct("=HH")


def _v6only(data: bytes, start: int, end: int) -> bool | None:
    """INET_DIAG_SKV6ONLY among the attributes in data[start:end], None if absent (IPv4, old kernels)."""
    while start + _RTA_HDR.size <= end:
        length, kind = _RTA_HDR.unpack_from(data, start)
        if length < _RTA_HDR.size:
            return None
        if kind == _INET_DIAG_SKV6ONLY and length > _RTA_HDR.size:
            return bool(data[start + _RTA_HDR.size])
        start += (length + 3) & ~3  # RTA_ALIGN
    return None


def _diag_listeners(family: int) -> Iterator[TcpRow]:
    """Every LISTEN socket of one address family via a NETLINK_SOCK_DIAG dump (the kernel
    filters by state, so the answer is a few rows however many connections the host has)."""
    sockid = b"\0" * 40 + struct.pack("=III", 0, _INET_DIAG_NOCOOKIE, _INET_DIAG_NOCOOKIE)
    req = _DIAG_REQ_HEAD.pack(family, socket.IPPROTO_TCP, 0, 0, 1 << _TCP_LISTEN) + sockid
    msg = _NLMSG_HDR.pack(_NLMSG_HDR.size + len(req), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST | _NLM_F_DUMP, 1, 0) + req
    addr_len = 4 if family == socket.AF_INET else 16
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(1.0)  # the kernel answers synchronously; this only guards against a wedge
        nl.sendto(msg, (0, 0))
        while True:
            data = nl.recv(65536)
            off = 0
            while off + _NLMSG_HDR.size <= len(data):
                length, mtype, _, _, _ = _NLMSG_HDR.unpack_from(data, off)
                if length < _NLMSG_HDR.size:
                    raise OSError(errno.EPROTO, "malformed sock_diag reply")
                if mtype == _NLMSG_DONE:
                    return
                if mtype == _NLMSG_ERROR:
                    err = -struct.unpack_from("=i", data, off + _NLMSG_HDR.size)[0]
                    raise OSError(err, os.strerror(err))
                body = off + _NLMSG_HDR.size
                if mtype == _SOCK_DIAG_BY_FAMILY and length >= _NLMSG_HDR.size + 4 + 48 + _DIAG_MSG_TAIL.size:
                    _, state, _, _ = _DIAG_MSG_HEAD.unpack_from(data, body)
                    sport, dport = struct.unpack_from(">HH", data, body + 4)
                    src = data[body + 8:body + 8 + addr_len]
                    dst = data[body + 24:body + 24 + addr_len]
                    _, _, _, uid, inode = _DIAG_MSG_TAIL.unpack_from(data, body + 4 + 48)
                    attrs = body + 4 + 48 + _DIAG_MSG_TAIL.size
                    v6only = _v6only(data, attrs, off + length) if family == socket.AF_INET6 else None
                    yield TcpRow((str(ipaddress.ip_address(src)), sport), (str(ipaddress.ip_address(dst)), dport),
                                 state, uid, inode, v6only)
                off += (length + 3) & ~3  # NLMSG_ALIGN


def proc_listeners(port: int) -> list[TcpRow]:
    """The LISTEN sockets on `port` from /proc/net/tcp{,6}: slow (milliseconds, the kernel walks
    its whole table). Only the tests read it, to check listeners() against the kernel's other view;
    without sock_diag the listen watch gives up instead (probe/listen.py)."""
    rows: list[TcpRow] = []
    key = f":{port:04X}"
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path, encoding="ascii") as f:
                text = f.read()
        except OSError:
            continue  # no IPv6 in this kernel, for instance
        for line in text.splitlines()[1:]:
            fields = line.split(None, 4)
            if len(fields) >= 4 and fields[1].endswith(key) and fields[3] == "0A":
                rows.append(parse_tcp_line(line))
    return rows


def all_listeners() -> list[TcpRow]:
    """Every LISTEN socket in this network namespace, IPv4 and IPv6, from sock_diag dumps: tens
    of microseconds, cheap enough to ask every 0.1 s while a server loads. Raises OSError when
    sock_diag is unusable (the listen watch then probes on the plain schedule)."""
    rows = list(_diag_listeners(socket.AF_INET))
    try:
        rows += _diag_listeners(socket.AF_INET6)
    except OSError as e:
        if e.errno not in (errno.ENOENT, errno.EAFNOSUPPORT, errno.EINVAL):
            raise  # else: a kernel without IPv6 (or its diag module) has no IPv6 listeners either
    return rows


def listeners(port: int, rows: list[TcpRow] | None = None) -> list[TcpRow]:
    """The LISTEN sockets on `port`, any address: of `rows`, a dump already made by
    all_listeners(), else of a new one."""
    return [r for r in (all_listeners() if rows is None else rows) if r.local[1] == port]


# --- finding the process ------------------------------------------------------------------------

def comm_ppid(pid: int) -> tuple[str, int] | None:
    """(comm, ppid) of a live process, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # comm may contain spaces and parentheses: it ends at the LAST ')'.
    head, _, tail = raw.rpartition(b")")
    fields = tail.split()
    if len(fields) < 2:
        return None
    return head.partition(b"(")[2].decode(errors="replace"), int(fields[1])


def cmdline(pid: int) -> list[str] | None:
    """A process's command line as the kernel holds it (/proc/PID/cmdline: after systemd's expansion of
    $VARS, and the program a wrapper exec'd); None when it cannot be read (gone, or hidden from us)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return None


def holds_fd(pid: int, target: str) -> bool:
    """Does pid have an fd linking to target? PermissionError propagates; a vanished process
    (or fd) is simply "no"."""
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except PermissionError:
        raise
    except OSError:
        return False
    for name in names:
        try:
            if os.readlink(f"/proc/{pid}/fd/{name}") == target:
                return True
        except PermissionError:
            raise
        except OSError:
            continue
    return False


def _children(pid: int) -> list[int] | None:
    """Direct children of pid from /proc/PID/task/*/children; None if that file is unavailable
    (kernel without CONFIG_PROC_CHILDREN), [] if pid is gone."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    out: list[int] = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out.extend(int(c) for c in f.read().split())
        except FileNotFoundError:
            if os.path.exists(f"/proc/{pid}/task/{tid}"):
                return None
        except OSError:
            continue
    return out


def all_pids() -> list[int]:
    """Every process id in /proc now (a process may be gone by the time it is read)."""
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _descendants(main_pid: int) -> Iterator[int]:
    """main_pid's descendants, breadth first (excluding main_pid itself)."""
    kids = _children(main_pid)
    if kids is None:
        # No children files: derive the tree from every process's ppid instead.
        by_parent: dict[int, list[int]] = {}
        for pid in all_pids():
            st = comm_ppid(pid)
            if st is not None:
                by_parent.setdefault(st[1], []).append(pid)
        queue = deque(by_parent.get(main_pid, []))
        seen = {main_pid}
        while queue:
            pid = queue.popleft()
            if pid not in seen:
                seen.add(pid)
                yield pid
                queue.extend(by_parent.get(pid, []))
        return
    queue = deque(kids)
    seen = {main_pid}
    while queue:
        pid = queue.popleft()
        if pid in seen:
            continue
        seen.add(pid)
        yield pid
        queue.extend(_children(pid) or [])


def is_descendant(pid: int, main_pid: int) -> bool:
    """Walk pid's ppid chain up to main_pid. The children files are racy, so this is the final
    word on trust for a holder found outside the tree we walked."""
    seen: set[int] = set()
    while pid > 1 and pid not in seen:
        seen.add(pid)
        st = comm_ppid(pid)
        if st is None:
            return False
        pid = st[1]
        if pid == main_pid:
            return True
    return False


def find_owner(local: tuple[str, int], peer: tuple[str, int], main_pid: int) -> Owner:
    """Who holds the server side of our connection (local, peer), and is it main_pid or one of its
    descendants? Never raises for processes that vanish mid-scan."""
    row = find_tcp_row(peer, local)
    if row is None:
        return Owner(None, False, f"no server-side socket for {peer[0]}:{peer[1]} <- {local[0]}:{local[1]} "
                                  "on this host (remote server, or another network namespace)")
    if row.inode == 0:
        if row.state in _OPEN_STATES:
            return Owner(None, False, "not accepted yet (the server has not accept()ed the connection)")
        state = TCP_STATES.get(row.state, str(row.state))
        return Owner(None, False, f"the server already closed its side of the connection ({state})")
    return socket_owner(row.inode, main_pid)


def socket_owner(inode: int, main_pid: int) -> Owner:
    """Who holds the socket with this inode (a connection's server side, or a LISTEN socket), and
    is it main_pid or one of its descendants? Never raises for processes that vanish mid-scan."""
    target = f"socket:[{inode}]"
    denied: list[int] = []  # pids whose fds we could not read
    trusted_denied = 0  # how many of those were main_pid or its descendants

    def holds(pid: int) -> bool:
        try:
            return holds_fd(pid, target)
        except PermissionError:
            denied.append(pid)
            return False

    # The common case costs one fd listing: HTTP servers usually answer from the main process.
    if main_pid > 0:
        if holds(main_pid):
            return Owner(main_pid, True, f"pid {main_pid} (main)")
        scanned = {main_pid}
        for pid in _descendants(main_pid):
            scanned.add(pid)
            if holds(pid):
                return Owner(pid, True, f"pid {pid} (descendant of main pid {main_pid})")
        trusted_denied = len(denied)
    else:
        scanned = set()
    # Not the unit's: name the foreign holder so the operator can find it.
    for pid in all_pids():
        if pid in scanned or not holds(pid):
            continue
        if main_pid > 0 and is_descendant(pid, main_pid):
            return Owner(pid, True, f"pid {pid} (descendant of main pid {main_pid})")
        st = comm_ppid(pid)
        who = f" (comm {st[0]!r}, parent {st[1]})" if st else ""
        if main_pid <= 0:
            detail = f"pid {pid} holds the connection but the unit has no main pid{who}"
        else:
            gone = "" if os.path.exists(f"/proc/{main_pid}") else f"; main pid {main_pid} does not exist"
            detail = f"pid {pid} is not main pid {main_pid} or its descendant{who}{gone}"
        if trusted_denied:
            detail += (f"; permission denied reading fds of the unit's {_pids(denied[:trusted_denied])}"
                       f" ({_denied_because()})")
        return Owner(pid, False, detail)
    if denied:
        return Owner(None, False, f"permission denied reading fds of {_pids(denied)} ({_denied_because()}); "
                                  f"socket inode {inode} not found elsewhere")
    return Owner(None, False, f"no process holds socket inode {inode} "
                              "(closed meanwhile, or held in another pid namespace)")


def _pids(pids: list[int]) -> str:
    shown = ", ".join(str(p) for p in pids[:5])
    return f"pids {shown}" + (f" and {len(pids) - 5} more" if len(pids) > 5 else "")


def _effective_caps() -> int:
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        pass
    return 0


def missing_capabilities() -> list[str]:
    """The capabilities this process lacks to read other users' /proc/PID/fd, by name.

    Measured: root without CAP_SYS_PTRACE can list another uid's /proc/PID/fd but not readlink
    it; a non-root user with CAP_SYS_PTRACE alone cannot even open the directory (mode 0500).
    """
    caps = _effective_caps()
    missing = []
    if not caps & (1 << _CAP_SYS_PTRACE):
        missing.append("CAP_SYS_PTRACE")
    if not caps & ((1 << _CAP_DAC_READ_SEARCH) | (1 << _CAP_DAC_OVERRIDE)):
        missing.append("CAP_DAC_READ_SEARCH")
    return missing


def _denied_because() -> str:
    missing = missing_capabilities()
    if missing:
        return f"genready (uid {os.geteuid()}) lacks {' and '.join(missing)}"
    return "although CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH are held: an LSM or another pid namespace?"


def owner_check_unavailable() -> str | None:
    """Why this process cannot prove the owner of every server here, or None if it can.

    Without the capabilities, servers running as our own uid can still be proven; find_owner
    reports "permission denied" for the others instead of trusting them.
    """
    if sys.platform != "linux":
        return f"owner proof needs Linux /proc (this is {sys.platform})"
    if not os.access("/proc/self/fd", os.R_OK):
        return "/proc is not mounted or not readable"
    if not os.access("/proc/net/tcp", os.R_OK):
        return "/proc/net/tcp is not readable"
    missing = missing_capabilities()
    if missing:
        uid = os.geteuid()
        return (f"running as uid {uid} without {' and '.join(missing)}: the fds of other users' processes "
                f"are unreadable, so only servers running as uid {uid} can be proven "
                "(run genready as root, or grant it CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH)")
    return None


def unit_holds(inode: int, main_pid: int) -> bool | None:
    """Does main_pid or one of its descendants hold the socket with this inode? None when that
    cannot be told (some of their fds are unreadable, or there is no main pid)."""
    if main_pid <= 0 or inode <= 0:
        return None
    target = f"socket:[{inode}]"
    unreadable = False
    for pid in (main_pid, *_descendants(main_pid)):
        try:
            if holds_fd(pid, target):
                return True
        except PermissionError:
            unreadable = True
    return None if unreadable else False


def descendants(main_pid: int, limit: int | None = None) -> list[int]:
    """main_pid's descendants (not main_pid itself), breadth first, the first `limit` of them (None: all);
    [] if it is gone. The walk stops at the limit."""
    return list(islice(_descendants(main_pid), limit))


# --- unix sockets -------------------------------------------------------------------------------

_UDIAG_REQ: Final = struct.Struct("=BBHIIIII")  # family, protocol, pad, states, ino, show, cookie[2]
_UDIAG_MSG: Final = struct.Struct("=BBBBIII")  # family, type, state, pad, ino, cookie[2]
_UDIAG_SHOW_PEER: Final = 0x4
_UNIX_DIAG_PEER: Final = 2


def unix_peer_inode(inode: int) -> int | None:
    """The inode of the other end of our unix socket `inode` (for a client's socket: the server's
    accepted one) from NETLINK_SOCK_DIAG's unix_diag; None if the kernel names none. Raises OSError
    when unix_diag is unusable (no unix_diag module, seccomp, RestrictAddressFamilies=)."""
    req = _UDIAG_REQ.pack(socket.AF_UNIX, 0, 0, 0xFFFFFFFF, inode, _UDIAG_SHOW_PEER,
                          _INET_DIAG_NOCOOKIE, _INET_DIAG_NOCOOKIE)
    data = _diag_ask(req, 1)
    length, mtype, _, _, _ = _NLMSG_HDR.unpack_from(data)
    if mtype == _NLMSG_ERROR:
        err = -struct.unpack_from("=i", data, _NLMSG_HDR.size)[0]
        raise OSError(err, os.strerror(err))
    body = _NLMSG_HDR.size
    if mtype != _SOCK_DIAG_BY_FAMILY or len(data) < body + _UDIAG_MSG.size:
        raise OSError(errno.EPROTO, "unexpected unix_diag reply")
    if _UDIAG_MSG.unpack_from(data, body)[4] != inode:
        raise OSError(errno.EPROTO, "unix_diag answered for another socket")
    at, end = body + _UDIAG_MSG.size, min(len(data), length)
    while at + _RTA_HDR.size <= end:
        rta_len, kind = _RTA_HDR.unpack_from(data, at)
        if rta_len < _RTA_HDR.size:
            break
        if kind == _UNIX_DIAG_PEER and rta_len >= _RTA_HDR.size + 4:
            peer: int = struct.unpack_from("=I", data, at + _RTA_HDR.size)[0]
            return peer or None
        at += (rta_len + 3) & ~3  # RTA_ALIGN
    return None


def unix_owner(peer_pid: int, main_pid: int, inode: int = 0) -> Owner:
    """Who serves a unix-socket connection whose client end has `inode`: as for TCP, the holder of
    the accepted server-side socket (its inode from unix_diag), under the MainPID-or-descendant
    rule. The listener may be another process: systemd with ListenStream= (socket activation), or
    a server that listened and then daemonized. Only where unix_diag cannot say (or inode is 0):
    the kernel's SO_PEERCRED pid, the process that called listen()."""
    if inode > 0:
        try:
            peer = unix_peer_inode(inode)
        except OSError:
            peer = None  # unix_diag unusable here: the listener's credentials are what is left
        if peer is not None:
            return socket_owner(peer, main_pid)
    return _peercred_owner(peer_pid, main_pid)


def _peercred_owner(peer_pid: int, main_pid: int) -> Owner:
    if peer_pid <= 0:
        return Owner(None, False, "the kernel gave no peer credentials (SO_PEERCRED) for the unix socket")
    st = comm_ppid(peer_pid)
    if st is None:
        return Owner(None, False, f"the socket's listener, pid {peer_pid} (SO_PEERCRED), no longer exists")
    if main_pid > 0 and peer_pid == main_pid:
        return Owner(peer_pid, True, f"pid {peer_pid} (main, SO_PEERCRED)")
    if main_pid > 0 and is_descendant(peer_pid, main_pid):
        return Owner(peer_pid, True, f"pid {peer_pid} (descendant of main pid {main_pid}, SO_PEERCRED)")
    who = f" (comm {st[0]!r}, parent {st[1]})"
    if main_pid <= 0:
        return Owner(peer_pid, False, f"pid {peer_pid} listens on the socket but the unit has no main pid{who}")
    return Owner(peer_pid, False, f"pid {peer_pid} listens on the socket (SO_PEERCRED) and is not main pid "
                                  f"{main_pid} or its descendant{who}")
