"""Who answered, through a container engine: the container that serves our connection, and whether
the unit's current start created it (`owner = "container"`).

A published port hides the server from the plain owner proof (owner.py): with docker's userland
proxy the host-side socket belongs to docker-proxy, a child of dockerd; with NAT (podman's
netavark, docker with `userland-proxy: false`, or a connection to the container's own address) the
server-side socket is not in the host's network namespace at all; only `--network host` leaves it
in ours. So the connection is followed to the process that really serves it:

- docker-proxy: its command line names the container address and port, and its backend socket to
  that address is the exact 4-tuple the server's socket has inside the container.
- NAT: /proc/net/nf_conntrack holds the translated (reply) tuple of our very connection.
- host network: the server-side socket is in our namespace; its holder is found directly.

Another namespace's sockets are read from /proc/PID/net/tcp of a process inside it. Not setns
(the shipped unit has RestrictNamespaces=yes) and not sock_diag (netlink only sees our own
namespace, and the unit allows no AF_NETLINK).

The serving process's cgroup names its container (`…/docker-<id>.scope`, `/docker/<id>`,
`…/libpod-<id>.scope`, `/libpod_parent/libpod-<id>`, `<unit>/libpod-payload-<id>`); the engine's
API on its unix socket gives its name and creation time. The answer is trusted only if that
container is named as configured (or as the unit's own `docker run --name` says) and was
created after the unit's current ExecMainStartTimestamp: a lingering container of the previous
start is older than that. An unnamed container must carry the start's INVOCATION_ID (`-e
INVOCATION_ID`). When the MainPID is podman's conmon (`--sdnotify=conmon`, Quadlet), its command
line names the one container it monitors, which must be the one that answered; there the
timestamp is no help, since systemd resets ExecMainStartTimestamp when podman sends MAINPID=,
after the container was created.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import json
import os
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

from genready.compat import UTC
from genready.probe.owner import (
    Addr,
    Owner,
    TcpRow,
    all_pids,
    cmdline,
    comm_ppid,
    decode_hex_addr,
    encode_hex_addr,
    find_owner,
    find_tcp_row,
    holds_fd,
    is_descendant,
)
from genready.store import bounded

ENGINES: Final = ("docker", "podman")
# Where each engine's API listens when the target's container_socket is empty (rootful defaults).
DEFAULT_SOCKETS: Final = {"docker": "/var/run/docker.sock", "podman": "/run/podman/podman.sock"}
DOCKER_ROOT: Final = "/var/lib/docker"  # dockerd's default data-root
_API_TIMEOUT: Final = 3.0  # a local daemon answers an inspect in milliseconds; this only bounds a wedge

# One cgroup path segment that names a container, per engine. conmon's own scope
# (libpod-conmon-<id>.scope) is not the container and does not match.
_SEGMENTS: Final = (
    (re.compile(r"docker-([0-9a-f]{64})\.scope"), "docker"),  # systemd cgroup driver
    (re.compile(r"libpod-([0-9a-f]{64})(?:\.scope)?"), "podman"),  # systemd driver and cgroupfs
    (re.compile(r"libpod-payload-([0-9a-f]{64})"), "podman"),  # --cgroups=split: inside the unit's cgroup
)


class EngineError(Exception):
    """The engine's API could not say what the container is; the text says why."""


@dataclass(frozen=True)
class UnitStart:
    """The unit's current start, as systemd reported it around the probe."""

    main_pid: int
    started_us: int  # ExecMainStartTimestamp, CLOCK_REALTIME µs; 0 = unknown
    invocation_id: str = ""


@dataclass(frozen=True)
class Container:
    """What the engine says about one container."""

    engine: str
    id: str
    name: str
    created_us: int  # CLOCK_REALTIME µs
    env: tuple[str, ...]


# --- which container a process is in -------------------------------------------------------------

def container_of_cgroup(text: str) -> tuple[str, str] | None:
    """(engine, container id) from the contents of /proc/PID/cgroup, or None if it names none."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        parts = path.split("/")
        # The innermost container wins: podman may nest a "container" subgroup under its scope.
        for i in range(len(parts) - 1, -1, -1):
            seg = parts[i]
            for pattern, engine in _SEGMENTS:
                if m := pattern.fullmatch(seg):
                    return engine, m.group(1)
            if i > 0 and parts[i - 1] == "docker" and re.fullmatch(r"[0-9a-f]{64}", seg):
                return "docker", seg  # cgroupfs driver: /docker/<id>
    return None


def _cgroup(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def name_from_cmdline(argv: list[str]) -> str | None:
    """The container name a `docker|podman run|create --name X` client, or conmon (`-n X`), gives."""
    if not argv:
        return None
    prog = os.path.basename(argv[0])
    flags = ("-n",) if prog == "conmon" else ("--name",)
    for i, arg in enumerate(argv[1:], 1):
        if arg == "--":
            break
        for flag in flags:
            if arg == flag and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(flag + "="):
                return arg[len(flag) + 1:]
    return None


def conmon_container(argv: list[str]) -> str | None:
    """The container id a conmon process monitors (its `-c ID`), or None if argv is not conmon's."""
    if not argv or os.path.basename(argv[0]) != "conmon":
        return None
    for i, arg in enumerate(argv[1:-1], 1):
        if arg in ("-c", "--cid") and re.fullmatch(r"[0-9a-f]{64}", argv[i + 1]):
            return argv[i + 1]
    return None


# --- the engine's API ---------------------------------------------------------------------------

def parse_time_us(text: str) -> int:
    """RFC 3339 with up to nanoseconds ("2026-12-01T06:01:15.194190878Z", "…+01:00") -> epoch µs."""
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", text.strip())
    if not m:
        raise ValueError(f"not an RFC 3339 time: {text!r}")
    base = datetime.datetime.fromisoformat(m.group(1) + ("+00:00" if m.group(3) == "Z" else m.group(3)))
    frac = (m.group(2) or "0")[:6].ljust(6, "0")
    return int(base.timestamp()) * 1_000_000 + int(frac)


def _docker_files(cid: str, api_error: EngineError) -> Container:
    """dockerd's own record of a container, for when its API socket is out of reach: the shipped
    unit runs genready unprivileged, and access to docker.sock (the docker group) would make it
    root-equivalent, while reading this root-only file takes just the CAP_DAC_READ_SEARCH it has."""
    path = f"{DOCKER_ROOT}/containers/{cid}/config.v2.json"
    try:
        doc: dict[str, Any] = json.loads(bounded.read_file(path, 16 << 20))  # the one bounded reader
        name = str(doc.get("Name") or "").lstrip("/")
        created = parse_time_us(str(doc["Created"]))
        env = tuple(str(e) for e in (doc.get("Config") or {}).get("Env") or ())
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise EngineError(f"{api_error}; and {path} is unreadable too ({why})") from None
    return Container("docker", str(doc.get("ID") or cid), name, created, env)


def inspect(engine: str, cid: str, sock_path: str = "") -> Container:
    """Ask the engine (Docker's API; podman serves the same one) about container `cid`; for docker,
    read dockerd's file about it when the API is unreachable."""
    try:
        return _inspect_api(engine, cid, sock_path)
    except EngineError as e:
        if engine != "docker":
            raise
        return _docker_files(cid, e)


def _inspect_api(engine: str, cid: str, sock_path: str) -> Container:
    path = sock_path or DEFAULT_SOCKETS[engine]
    what = f"{engine}'s API at {path}"
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(_API_TIMEOUT)
            s.connect(path)
            # HTTP/1.0: the engine closes after one answer, so reading to EOF is the whole body.
            s.sendall(f"GET /containers/{cid}/json HTTP/1.0\r\nHost: {engine}\r\n\r\n".encode("ascii"))
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
    except FileNotFoundError:
        raise EngineError(f"{what} does not exist (is the {engine} API service running? "
                          "set container_socket if it listens elsewhere)") from None
    except PermissionError:
        raise EngineError(f"no permission to use {what} (genready needs access to the engine's "
                          "API socket: run it as root or in the socket's group)") from None
    except OSError as e:
        raise EngineError(f"cannot ask {what}: {e.strerror or e}") from None
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    status = head.split(b" ", 2)[1:2]
    if status != [b"200"]:
        first = head.split(b"\r\n", 1)[0].decode(errors="replace")
        raise EngineError(f"{what} answered {first!r} to GET /containers/{cid[:12]}/json")
    try:
        doc: dict[str, Any] = json.loads(body)
        name = str(doc.get("Name") or "").lstrip("/")
        created = parse_time_us(str(doc["Created"]))
        env = tuple(str(e) for e in (doc.get("Config") or {}).get("Env") or ())
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise EngineError(f"{what} gave an inspect answer without a name or creation time: {e}") from None
    return Container(engine, str(doc.get("Id") or cid), name, created, env)


# --- following the connection to the process that serves it -----------------------------------

def _socket_inodes(pid: int) -> set[int]:
    out: set[int] = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    out.add(int(link[8:-1]))
    return out


def _netns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def _namespaces() -> dict[str, list[int]]:
    """Every network namespace a process is in, with its processes; ours first."""
    ours = _netns(os.getpid())
    out: dict[str, list[int]] = {ours: []} if ours else {}
    for pid in all_pids():
        ns = _netns(pid)
        if ns is not None:
            out.setdefault(ns, []).append(pid)
    return out


def _holder(pids: list[int], inode: int) -> int | None:
    target = f"socket:[{inode}]"
    for pid in pids:
        with contextlib.suppress(PermissionError):
            if holds_fd(pid, target):
                return pid
    return None


def _rows_at(addr: Addr, net_dir: str, column: int) -> Iterator[TcpRow]:
    """Rows whose local (column 1) or remote (column 2) address is exactly `addr`: a text search,
    like owner._proc_rows, for a table whose other address we do not know."""
    ip = ipaddress.ip_address(addr[0])
    files = [(f"{net_dir}/tcp", f" {encode_hex_addr(addr)} ")] if ip.version == 4 else []
    files.append((f"{net_dir}/tcp6", f" {encode_hex_addr(addr, v6=True)} "))
    for path, key in files:
        try:
            with open(path, encoding="ascii") as f:
                text = f.read()
        except OSError:
            continue
        start = text.find(key)
        while start >= 0:
            line_start = text.rfind("\n", 0, start) + 1
            line_end = text.find("\n", start)
            fields = text[line_start:line_end if line_end >= 0 else len(text)].split()
            start = text.find(key, start + 1)
            if len(fields) > 9 and fields[column] == key.strip():
                yield TcpRow(decode_hex_addr(fields[1]), decode_hex_addr(fields[2]), int(fields[3], 16),
                             int(fields[7]), int(fields[9]))


def conntrack_reply(local: Addr, peer: Addr, path: str = "/proc/net/nf_conntrack") -> tuple[Addr, Addr] | None:
    """For our connection local -> peer, the (server local, server remote) pair after NAT, from the
    reply tuple of its conntrack entry; None if there is none (or no conntrack file)."""
    want = (ipaddress.ip_address(local[0]), local[1], ipaddress.ip_address(peer[0]), peer[1])
    needle = f"sport={local[1]} dport={peer[1]} "
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            for line in f:
                if needle not in line or " tcp " not in line:
                    continue
                kv = [tok.split("=", 1) for tok in line.split() if "=" in tok]
                src = [v for k, v in kv if k == "src"]
                dst = [v for k, v in kv if k == "dst"]
                sport = [v for k, v in kv if k == "sport"]
                dport = [v for k, v in kv if k == "dport"]
                if len(src) < 2 or len(dst) < 2 or len(sport) < 2 or len(dport) < 2:
                    continue
                orig = (ipaddress.ip_address(src[0]), int(sport[0]), ipaddress.ip_address(dst[0]), int(dport[0]))
                if orig != want:
                    continue
                return (str(ipaddress.ip_address(src[1])), int(sport[1])), \
                       (str(ipaddress.ip_address(dst[1])), int(dport[1]))
    except (OSError, ValueError):
        return None
    return None


@dataclass(frozen=True)
class Route:
    """Where the connection led: the serving process (None if not found) and how we got there."""

    pid: int | None
    lead: str = ""  # the hops before pid: "docker-proxy pid 812 → "
    note: str = ""  # how pid was reached, after it: " (NAT to 10.88.0.5:30000)"
    problem: str = ""  # why pid is None


def _in_other_namespace(server_local: Addr, server_remote: Addr, nss: dict[str, list[int]]) -> tuple[int, int] | None:
    """(holder pid, inode) of the socket (server_local, server_remote) in some other namespace."""
    ours = _netns(os.getpid())
    for ns, pids in nss.items():
        if ns == ours or not pids:
            continue
        row = find_tcp_row(server_local, server_remote, net_dir=f"/proc/{pids[0]}/net")
        if row is None or row.inode == 0:
            continue
        holder = _holder(pids, row.inode)
        if holder is not None:
            return holder, row.inode
    return None


def _through_proxy(proxy: int, argv: list[str], nss: dict[str, list[int]]) -> Route:
    opts = {argv[i]: argv[i + 1] for i in range(1, len(argv) - 1) if argv[i].startswith("-")}
    cip, cport = opts.get("-container-ip"), opts.get("-container-port")
    hop = f"docker-proxy pid {proxy}"
    if not cip or not cport or not cport.isdigit():
        return Route(None, hop, problem="its command line names no -container-ip/-container-port")
    backend = (cip, int(cport))
    mine = _socket_inodes(proxy)
    ours = _netns(os.getpid())
    # Inside the containers, the server sides of connections to the backend address: their tables
    # are small, unlike the host's. Each one's peer is the proxy's end, which the exact (sock_diag)
    # lookup finds in our namespace; it must be a socket the proxy holds.
    for ns, pids in nss.items():
        if ns == ours or not pids:
            continue
        for row in _rows_at(backend, f"/proc/{pids[0]}/net", 1):
            if row.inode == 0:
                continue
            proxy_side = find_tcp_row(row.remote, row.local)
            if proxy_side is None or proxy_side.inode not in mine:
                continue
            holder = _holder(pids, row.inode)
            if holder is not None:
                return Route(holder, f"{hop} → ")
    return Route(None, hop, problem=f"no connection from it to {cip}:{cport} is held by a process in a container "
                           "(the container exited, or the proxy has not connected yet)")


def follow(local: Addr, peer: Addr) -> Route:
    """The process that serves our connection (local -> peer), through docker-proxy or NAT."""
    row = find_tcp_row(peer, local)
    if row is not None:
        if row.inode == 0:
            return Route(None, problem="not accepted yet (the server has not accept()ed the connection)")
        holder = _holder(all_pids(), row.inode)
        if holder is None:
            return Route(None, problem=f"no process holds socket inode {row.inode} (closed meanwhile, or unreadable)")
        argv = cmdline(holder) or []
        st = comm_ppid(holder)
        if (st and st[0] == "docker-proxy") or (argv and os.path.basename(argv[0]) == "docker-proxy"):
            return _through_proxy(holder, argv, _namespaces())
        return Route(holder)
    # Not in our namespace: NAT'd into a container (the reply tuple says where), or a connection
    # to a container's own address (the tuple is then just ours, mirrored).
    pairs: list[tuple[Addr, Addr]] = []
    nat = conntrack_reply(local, peer)
    if nat is not None and nat != (peer, local):
        pairs.append(nat)
    pairs.append((peer, local))
    nss = _namespaces()
    for server_local, server_remote in pairs:
        found = _in_other_namespace(server_local, server_remote, nss)
        if found is not None:
            via = "" if server_local == peer else f" (NAT to {server_local[0]}:{server_local[1]})"
            return Route(found[0], note=via)
    why = "" if nat is not None or os.path.exists("/proc/net/nf_conntrack") else \
        " (no /proc/net/nf_conntrack to follow NAT: load nf_conntrack with its procfs support)"
    return Route(None, problem=f"no process in any network namespace holds the server side of "
                          f"{local[0]}:{local[1]} -> {peer[0]}:{peer[1]}{why}")


# --- the verdict ------------------------------------------------------------------------------

def _clock(us: int) -> str:
    t = datetime.datetime.fromtimestamp(us / 1e6, UTC)
    return t.strftime("%H:%M:%S.") + f"{t.microsecond // 1000:03d}"


def judge(c: Container, start: UnitStart, expected_name: str | None, monitored: str | None = None) -> str | None:
    """Why container `c` is not the one the unit's current start launched, or None if it is.

    monitored: the container id the unit's MainPID monitors, when that is conmon: then it must be
    `c`. Otherwise the unit's container is named as configured (or as its run command says), or,
    unnamed, carries the start's INVOCATION_ID (`docker run -e INVOCATION_ID` copies it from the
    client, whose environment systemd set); and it was created after ExecMainStartTimestamp.
    """
    ids = [e.split("=", 1)[1].replace("-", "").lower() for e in c.env if e.startswith("INVOCATION_ID=")]
    if expected_name is not None and c.name != expected_name:
        return f"not the unit's container {expected_name!r}: a foreign container"
    stranger = bool(ids and start.invocation_id and ids[0] != start.invocation_id.replace("-", "").lower())
    another = f"its INVOCATION_ID {ids[0]} is not this start's {start.invocation_id}: another start's container" \
        if stranger else ""
    if monitored is not None:
        if c.id != monitored:
            return (f"the unit's main pid {start.main_pid} (conmon) monitors container {monitored[:12]}…, "
                    "not this one: an old or foreign container")
        return another or None
    if expected_name is None and not ids:
        return ("the unit's container name is unknown: set container = \"NAME\" for this target, run it with "
                "--name, or pass the start's identity with -e INVOCATION_ID")
    if start.started_us <= 0:
        return "systemd reports no start time for the unit (ExecMainStartTimestamp), so its age cannot be judged"
    if c.created_us < start.started_us:
        return f"before this start at {_clock(start.started_us)}: an old container"
    if another:
        return another
    if expected_name is None and not start.invocation_id:
        return "systemd reports no InvocationID for the unit, and the container has no name to match"
    return None


def find_container_owner(local: Addr, peer: Addr, start: UnitStart, name: str = "", sock_path: str = "") -> Owner:
    """Who serves our connection, and is it in the container that the unit's current start created?
    Never raises for processes that vanish mid-scan."""
    route = follow(local, peer)
    if route.pid is None:
        lead = f"answered by {route.lead}: " if route.lead else ""
        return Owner(None, False, lead + route.problem)
    st = comm_ppid(route.pid)
    by = f"{route.lead}pid {route.pid}" + (f" ({st[0]})" if st else "") + route.note
    text = _cgroup(route.pid)
    found = container_of_cgroup(text) if text is not None else None
    if found is None:
        where = (text or "").splitlines()[-1].split(":", 2)[-1] if text else "unreadable"
        return Owner(route.pid, False, f"answered by {by}, which is in no container (cgroup {where})")
    engine, cid = found
    main_argv = (cmdline(start.main_pid) or []) if start.main_pid > 0 else []
    monitored = conmon_container(main_argv)
    expected = name or (None if monitored else name_from_cmdline(main_argv))
    if monitored and not name:
        # The MainPID (conmon) names the one container of this start: the cgroup's id must be it,
        # and nothing else needs asking (podman's socket is root's alone).
        who = f"answered by {by} → {engine} container {cid[:12]}…"
        if cid != monitored:
            return Owner(route.pid, False, f"{who}, but the unit's main pid {start.main_pid} (conmon) monitors "
                                           f"container {monitored[:12]}…: an old or foreign container")
        return Owner(route.pid, True, f"{who}, monitored by the unit's main pid {start.main_pid} (conmon)")
    try:
        c = inspect(engine, cid, sock_path)
    except EngineError as e:
        return Owner(route.pid, False, f"answered by {by} in {engine} container {cid[:12]}…: {e}")
    who = f"answered by {by} → {engine} container {cid[:12]}… ({c.name}) created {_clock(c.created_us)}"
    problem = judge(c, start, expected or None, monitored)
    if problem:
        return Owner(route.pid, False, f"{who}, {problem}")
    if monitored:
        return Owner(route.pid, True, f"{who}, monitored by the unit's main pid {start.main_pid} (conmon)")
    return Owner(route.pid, True, f"{who}, after this start at {_clock(start.started_us)}")


def find_process_owner(local: Addr, peer: Addr, main_pid: int) -> Owner:
    """owner = "process" (owner.find_owner), also when the server's socket is in another network
    namespace: podman under --sdnotify=conmon makes conmon the MainPID and the container's
    processes its descendants, but with -p the serving socket sits in the container's namespace,
    reached through NAT. A docker-proxy holder is refused with a hint at owner = "container"."""
    if main_pid <= 0 or find_tcp_row(peer, local) is not None:
        owner = find_owner(local, peer, main_pid)
        st = comm_ppid(owner.pid) if owner.pid is not None and not owner.trusted else None
        if st is not None and st[0] == "docker-proxy":
            return Owner(owner.pid, False, owner.detail + '; a published docker port: set owner = "container"')
        return owner
    route = follow(local, peer)
    if route.pid is None:
        return find_owner(local, peer, main_pid)  # its detail explains the miss in our namespace
    st = comm_ppid(route.pid)
    by = f"pid {route.pid}" + (f" ({st[0]})" if st else "") + route.note
    if route.pid == main_pid:
        return Owner(route.pid, True, f"{by} (main)")
    if is_descendant(route.pid, main_pid):
        return Owner(route.pid, True, f"{by} (descendant of main pid {main_pid})")
    return Owner(route.pid, False, f"{by} is not main pid {main_pid} or its descendant")
