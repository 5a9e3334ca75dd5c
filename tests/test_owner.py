"""owner.py against real sockets and real processes: who holds the server side of a connection."""

from __future__ import annotations

import codecs
import json
import os
import select
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from genready import config
from genready.probe import owner
from genready.probe.owner import Owner, decode_hex_addr, encode_hex_addr, find_owner, parse_tcp_line
from genready.probe.probe import Prober
from genready.vocab import ProbeResult
from genready_dev.harness import REPO, Genready, show, wait_for
from genready_dev.usermanager import UserManager

DEADLINE = 10.0


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


HAS_V6 = _has_ipv6_loopback()
LITTLE = sys.byteorder == "little"


def addr(sockaddr: tuple[str, int] | tuple[str, int, int, int]) -> tuple[str, int]:
    return sockaddr[0], sockaddr[1]


class Pair:
    """A listener and a connected client on loopback; accept() on demand."""

    def __init__(self, family: socket.AddressFamily, host: str, *, dual_stack: bool = False) -> None:
        self.listener = socket.socket(family, socket.SOCK_STREAM)
        if dual_stack:
            self.listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        self.listener.bind((host, 0))
        self.listener.listen(8)
        port = self.listener.getsockname()[1]
        connect_host = "127.0.0.1" if dual_stack else host
        self.client = socket.create_connection((connect_host, port), timeout=DEADLINE)
        self.server: socket.socket | None = None

    @property
    def local(self) -> tuple[str, int]:
        return addr(self.client.getsockname())

    @property
    def peer(self) -> tuple[str, int]:
        return addr(self.client.getpeername())

    def accept(self) -> socket.socket:
        self.listener.settimeout(DEADLINE)
        self.server, _ = self.listener.accept()
        return self.server

    def close(self) -> None:
        for s in (self.client, self.server, self.listener):
            if s is not None:
                s.close()


@pytest.fixture
def pairs() -> Iterator[Callable[..., Pair]]:
    made: list[Pair] = []

    def make(family: socket.AddressFamily = socket.AF_INET, host: str = "127.0.0.1", **kw: bool) -> Pair:
        made.append(Pair(family, host, **kw))
        return made[-1]

    yield make
    for p in made:
        p.close()


FAMILIES = [
    pytest.param(socket.AF_INET, "127.0.0.1", id="ipv4"),
    pytest.param(socket.AF_INET6, "::1", id="ipv6",
                 marks=pytest.mark.skipif(not HAS_V6, reason="::1 is not available here")),
]


# --- hex parsing of literal /proc/net/tcp lines ---------------------------------------------------

@pytest.mark.skipif(not LITTLE, reason="the literals are as a little-endian kernel prints them")
class TestHexParsing:
    def test_ipv4_line(self) -> None:
        line = ("   3: 0100007F:1F90 0100007F:D9A4 01 00000000:00000000 00:00000000 00000000  1000"
                "        0 123456 1 0000000000000000 20 4 30 10 -1")
        row = parse_tcp_line(line)
        assert row.local == ("127.0.0.1", 8080)
        assert row.remote == ("127.0.0.1", 55716)
        assert row.state == 1 and row.uid == 1000 and row.inode == 123456

    def test_ipv4_word_is_little_endian(self) -> None:
        assert decode_hex_addr("0202000A:0050") == ("10.0.2.2", 80)
        assert decode_hex_addr("020011AC:01BB") == ("172.17.0.2", 443)

    def test_ipv6_loopback_and_global(self) -> None:
        assert decode_hex_addr("00000000000000000000000001000000:7530") == ("::1", 30000)
        # fd00::2 — each 32-bit word is byte-reversed on its own, not the whole 16 bytes.
        assert decode_hex_addr("000000FD000000000000000002000000:0016") == ("fd00::2", 22)
        assert decode_hex_addr("B80D0120000000000000000001000000:0001") == ("2001:db8::1", 1)

    def test_ipv4_mapped_ipv6(self) -> None:
        assert decode_hex_addr("0000000000000000FFFF00000100007F:7530") == ("::ffff:127.0.0.1", 30000)

    def test_tcp6_line_listening_not_accepted(self) -> None:
        line = ("   0: 0000000000000000FFFF00000100007F:7530 0000000000000000FFFF00000100007F:C350 03 "
                "00000000:00000000 00:00000000 00000000     0        0 0 1 0000000000000000 20 4 0 10 -1")
        row = parse_tcp_line(line)
        assert row.local == ("::ffff:127.0.0.1", 30000) and row.remote == ("::ffff:127.0.0.1", 50000)
        assert row.state == 3 and row.inode == 0

    def test_encode_is_the_inverse(self) -> None:
        for a in [("127.0.0.1", 8080), ("10.0.2.2", 80), ("::1", 30000), ("fd00::2", 22)]:
            assert decode_hex_addr(encode_hex_addr(a)) == a
        assert encode_hex_addr(("127.0.0.1", 30000), v6=True) == "0000000000000000FFFF00000100007F:7530"

    @pytest.mark.parametrize("bad", ["", "0100007F", "0100007F:1F9", "0100007:1F90", "XX00007F:1F90"])
    def test_malformed_address(self, bad: str) -> None:
        with pytest.raises(ValueError):
            decode_hex_addr(bad)

    def test_header_line_is_not_a_row(self) -> None:
        with pytest.raises(ValueError):
            parse_tcp_line("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid")


# --- the server socket's inode ------------------------------------------------------------------

@pytest.mark.parametrize(("family", "host"), FAMILIES)
@pytest.mark.parametrize("use_diag", [True, False], ids=["sock_diag", "proc"])
def test_inode_zero_before_accept_then_the_accepted_socket(
        pairs: Callable[..., Pair], family: socket.AddressFamily, host: str, use_diag: bool) -> None:
    p = pairs(family, host)
    row = owner.find_tcp_row(p.peer, p.local, use_diag=use_diag)
    assert row is not None and row.inode == 0  # in the backlog, not accepted
    assert find_owner(p.local, p.peer, os.getpid()) == Owner(
        None, False, "not accepted yet (the server has not accept()ed the connection)")
    srv = p.accept()
    row = owner.find_tcp_row(p.peer, p.local, use_diag=use_diag)
    assert row is not None and row.inode == os.fstat(srv.fileno()).st_ino
    assert row.local == p.peer and row.state == 1


@pytest.mark.skipif(not HAS_V6, reason="::1 is not available here")
@pytest.mark.parametrize("use_diag", [True, False], ids=["sock_diag", "proc"])
def test_dual_stack_server_sees_ipv4_client_as_mapped(pairs: Callable[..., Pair], use_diag: bool) -> None:
    p = pairs(socket.AF_INET6, "::", dual_stack=True)
    srv = p.accept()
    assert p.peer[0] == "127.0.0.1"  # the client is plain IPv4; the server row is in tcp6
    row = owner.find_tcp_row(p.peer, p.local, use_diag=use_diag)
    assert row is not None and row.inode == os.fstat(srv.fileno()).st_ino
    assert find_owner(p.local, p.peer, os.getpid()).pid == os.getpid()


def test_no_row_for_a_connection_that_does_not_exist(pairs: Callable[..., Pair]) -> None:
    p = pairs()
    p.accept()
    bogus = (p.local[0], p.local[1] ^ 1)  # same host, a port we did not connect from
    assert owner.find_tcp_row(p.peer, bogus) is None
    o = find_owner(bogus, p.peer, os.getpid())
    assert o.pid is None and not o.trusted and "no server-side socket" in o.detail


def test_server_closed_its_side(pairs: Callable[..., Pair]) -> None:
    p = pairs()
    p.accept().close()
    p.server = None
    # The server's socket goes FIN_WAIT2 (or TIME_WAIT) with no inode: not "not accepted yet".
    o = find_owner(p.local, p.peer, os.getpid())
    assert o.pid is None and not o.trusted
    assert "closed" in o.detail or "no server-side socket" in o.detail


# --- the owning process -------------------------------------------------------------------------

@pytest.mark.parametrize(("family", "host"), FAMILIES)
def test_owner_is_this_process(pairs: Callable[..., Pair], family: socket.AddressFamily, host: str) -> None:
    p = pairs(family, host)
    p.accept()
    assert find_owner(p.local, p.peer, os.getpid()) == Owner(os.getpid(), True, f"pid {os.getpid()} (main)")


HOLDER = textwrap.dedent("""
    import os, socket, subprocess, sys
    depth = int(sys.argv[1])
    if depth > 0:  # become a parent of the real holder, and report its pid too
        # stdin and stdout are inherited: the leaf reports to the test and blocks on its stdin.
        sys.exit(subprocess.call([sys.executable, "-c", sys.argv[2], str(depth - 1), sys.argv[2]]))
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(1)
    print(os.getpid(), ls.getsockname()[1], flush=True)
    conn, _ = ls.accept()
    print("accepted", flush=True)
    sys.stdin.read()  # hold the connection until the test closes our stdin
""")


class Holder:
    """A process tree (depth 0: one child; depth 1: child + grandchild) whose leaf accepts one
    connection from us and holds it."""

    def __init__(self, depth: int) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(depth), HOLDER],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        pid, port = self._line().split()
        self.leaf_pid = int(pid)
        self.client = socket.create_connection(("127.0.0.1", int(port)), timeout=DEADLINE)
        assert self._line() == "accepted"

    def _line(self) -> str:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], DEADLINE)
        assert ready, "the holder process did not answer in time"
        return self.proc.stdout.readline().strip()

    @property
    def local(self) -> tuple[str, int]:
        return addr(self.client.getsockname())

    @property
    def peer(self) -> tuple[str, int]:
        return addr(self.client.getpeername())

    def close(self) -> None:
        self.client.close()
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(DEADLINE)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def holder() -> Iterator[Callable[[int], Holder]]:
    made: list[Holder] = []

    def make(depth: int) -> Holder:
        made.append(Holder(depth))
        return made[-1]

    yield make
    for h in made:
        h.close()


@pytest.mark.system
def test_child_holding_the_socket_is_trusted_under_its_parent(holder: Callable[[int], Holder]) -> None:
    h = holder(0)
    assert h.leaf_pid == h.proc.pid
    o = find_owner(h.local, h.peer, os.getpid())  # we are the child's parent
    assert o == Owner(h.leaf_pid, True, f"pid {h.leaf_pid} (descendant of main pid {os.getpid()})")
    assert find_owner(h.local, h.peer, h.leaf_pid) == Owner(h.leaf_pid, True, f"pid {h.leaf_pid} (main)")


@pytest.mark.system
def test_grandchild_is_a_descendant(holder: Callable[[int], Holder]) -> None:
    h = holder(1)
    assert h.leaf_pid != h.proc.pid
    o = find_owner(h.local, h.peer, h.proc.pid)
    assert o == Owner(h.leaf_pid, True, f"pid {h.leaf_pid} (descendant of main pid {h.proc.pid})")


@pytest.mark.system
def test_unrelated_main_pid_makes_the_holder_foreign(holder: Callable[[int], Holder], unrelated_pid: int) -> None:
    h = holder(0)
    o = find_owner(h.local, h.peer, unrelated_pid)
    assert o.pid == h.leaf_pid and not o.trusted
    assert o.detail.startswith(f"pid {h.leaf_pid} is not main pid {unrelated_pid} or its descendant")
    assert "python" in o.detail  # names the process for the operator


@pytest.mark.system
def test_a_main_pid_that_does_not_exist(pairs: Callable[..., Pair]) -> None:
    p = pairs()
    p.accept()
    dead = subprocess.Popen(["true"])
    dead.wait()  # reaped: its pid is free (and, within this test, not reused by anything of ours)
    o = find_owner(p.local, p.peer, dead.pid)
    assert o.pid == os.getpid() and not o.trusted


def test_no_main_pid(pairs: Callable[..., Pair]) -> None:
    p = pairs()
    p.accept()
    o = find_owner(p.local, p.peer, 0)
    assert o.pid == os.getpid() and not o.trusted and "no main pid" in o.detail


@pytest.mark.system
def test_holder_exiting_mid_lookup_is_not_an_error(holder: Callable[[int], Holder]) -> None:
    h = holder(0)
    local, peer = h.local, h.peer
    h.proc.kill()
    h.proc.wait()
    o = find_owner(local, peer, os.getpid())  # the socket died with its process: nothing found, no raise
    assert o.pid is None and not o.trusted


# --- permissions --------------------------------------------------------------------------------

def _as_nobody(check: Callable[[], object], close: list[socket.socket]) -> object:
    """Run check() in a forked child that closed `close` (a fork shares every fd, so the child
    would otherwise hold the very socket it looks for) and dropped to uid/gid 65534."""
    # The child as uid 65534 cannot import from this interpreter's tree under /root (mode
    # 0700): load the codec owner.py's reads need while still root.
    codecs.lookup("ascii")
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        status = 1
        try:
            os.close(rfd)
            for sock in close:
                sock.close()
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            os.write(wfd, json.dumps(check()).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(wfd)
    with os.fdopen(rfd, "rb") as r:
        ready, _, _ = select.select([r], [], [], DEADLINE)
        assert ready, "the unprivileged child did not answer in time"
        data = r.read()
    _, status = os.waitpid(pid, 0)
    assert status == 0, f"child failed with status {status}"
    return json.loads(data)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a check as another user")
@pytest.mark.system
def test_permission_denied_is_reported_never_trusted(pairs: Callable[..., Pair]) -> None:
    p = pairs()
    srv = p.accept()  # held by this (root) process
    main_pid = os.getpid()

    def check() -> object:
        o = find_owner(p.local, p.peer, main_pid)
        return [o.pid, o.trusted, o.detail, owner.owner_check_unavailable()]

    result = _as_nobody(check, [srv, p.listener])
    assert isinstance(result, list)
    pid, trusted, detail, unavailable = result
    assert pid is None and trusted is False
    assert "permission denied" in detail
    assert unavailable is not None and "CAP_SYS_PTRACE" in unavailable


# What genready.service grants its (DynamicUser=) uid: exactly these, as ambient capabilities.
OWNER_CAPS = ("sys_ptrace", "dac_read_search")
DRIVER = """
import json, sys
from genready.probe import owner
local, peer, main_pid = (sys.argv[1], int(sys.argv[2])), (sys.argv[3], int(sys.argv[4])), int(sys.argv[5])
o = owner.find_owner(local, peer, main_pid)
print(json.dumps({"uid": __import__("os").geteuid(), "pid": o.pid, "trusted": o.trusted, "detail": o.detail,
                  "unavailable": owner.owner_check_unavailable()}))
"""


@pytest.fixture(scope="module")
def readable_code() -> Iterator[Path]:
    """A copy of the genready package that uid 65534 can read: this checkout and pytest's
    tmp_path may sit under directories of mode 0700."""
    root = Path(tempfile.mkdtemp(prefix="genready-code-"))
    try:
        shutil.copytree(REPO / "daemon" / "genready", root / "genready")
        for path in (root, *root.rglob("*")):
            path.chmod(0o755 if path.is_dir() else 0o644)
        yield root
    finally:
        shutil.rmtree(root)


def _setpriv_find_owner(code: Path, p: Pair, main_pid: int, caps: tuple[str, ...]) -> dict[str, object]:
    """find_owner in a process exec'd by setpriv as uid/gid 65534, no groups, holding `caps` as
    ambient capabilities (how systemd hands AmbientCapabilities= to a non-root service).
    Debian's /usr/bin/python3: without the capabilities, uid 65534 cannot reach this venv's."""
    spec = ",".join(f"+{c}" for c in caps) or "-all"
    args = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
            f"--inh-caps={spec}", f"--ambient-caps={spec}",
            SYSTEM_PYTHON, "-c", DRIVER, *map(str, (*p.local, *p.peer, main_pid))]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=DEADLINE,
                          env={"PYTHONPATH": str(code), "PATH": "/usr/bin:/bin"}, cwd="/")
    assert proc.returncode == 0, proc.stderr
    result: dict[str, object] = json.loads(proc.stdout)
    return result


SYSTEM_PYTHON = "/usr/bin/python3"
needs_setpriv = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None or not os.path.exists(SYSTEM_PYTHON),
    reason="needs root, setpriv (util-linux) and /usr/bin/python3")


@needs_setpriv
@pytest.mark.parametrize("caps", [OWNER_CAPS, ("sys_ptrace",), ("dac_read_search",), ()],
                         ids=["both", "sys_ptrace-only", "dac_read_search-only", "none"])
@pytest.mark.system
def test_unprivileged_owner_proof_of_a_root_server(
        pairs: Callable[..., Pair], readable_code: Path, caps: tuple[str, ...]) -> None:
    """genready.service runs as an unprivileged uid with CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH:
    with both it proves a server running as root; with either missing it trusts nothing and
    the failure names the capability that is missing."""
    p = pairs()
    p.accept()  # the server side is held by this process, running as root
    out = _setpriv_find_owner(readable_code, p, os.getpid(), caps)
    assert out["uid"] == 65534
    if caps == OWNER_CAPS:
        assert (out["pid"], out["trusted"]) == (os.getpid(), True), out
        assert out["unavailable"] is None
        return
    assert (out["pid"], out["trusted"]) == (None, False), out
    missing = " and ".join(f"CAP_{c.upper()}" for c in OWNER_CAPS if c not in caps)
    assert "permission denied" in str(out["detail"]) and f"lacks {missing})" in str(out["detail"]), out
    assert f"without {missing}:" in str(out["unavailable"]), out


@pytest.mark.skipif(os.geteuid() != 0, reason="root with all capabilities expected")
def test_owner_check_available_as_root() -> None:
    caps = owner._effective_caps()
    if not caps & (1 << 19):
        pytest.skip("root without CAP_SYS_PTRACE here")
    assert owner.owner_check_unavailable() is None


def test_lookup_cost(pairs: Callable[..., Pair]) -> None:
    p = pairs()
    p.accept()
    n = 50
    t = time.process_time()  # this process's CPU time: the other processes of a shared machine do not count
    for _ in range(n):
        assert find_owner(p.local, p.peer, os.getpid()).trusted
    per = (time.process_time() - t) / n
    # A generous ceiling (budget is ~2 ms); it catches a regression to whole-/proc scans.
    assert per < 0.02, f"{per * 1e3:.2f} ms per lookup"


# --- unix sockets: the accepted end's holder, whoever listens --------------------------------------

# A keep-alive HTTP server answering every request with an SGLang-shaped generation, on a socket it is
# given; it says "accepted" for each connection.
SERVE = """
import json, os, socket, sys
BODY = json.dumps({"text": " OK", "output_ids": [11], "meta_info": {"id": "a", "finish_reason": {"type": "length"},
                   "prompt_tokens": 3, "completion_tokens": 1}}).encode()
def serve(s):
    while True:
        c, _ = s.accept()
        print("accepted", flush=True)
        f = c.makefile("rb")
        while f.readline():
            length = 0
            while (h := f.readline()) not in (b"\\r\\n", b""):
                if h.lower().startswith(b"content-length:"):
                    length = int(h.split(b":")[1])
            f.read(length)
            c.sendall(b"HTTP/1.1 200 OK\\r\\nContent-Type: application/json\\r\\nContent-Length: %d\\r\\n\\r\\n"
                      % len(BODY) + BODY)
        f.close()
        c.close()
"""
# Takes the listening socket at the fd it is given (as systemd passes it with ListenStream=).
ACTIVATED = SERVE + "serve(socket.socket(fileno=int(sys.argv[1])))\n"
# Listens, then daemonizes (Type=forking): the listener exits, its child accepts and answers.
FORKING = SERVE + """
s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen()
if os.fork():
    os._exit(0)
print(os.getpid(), flush=True)
serve(s)
"""


async def _probe_unix(path: str, main_pid: int) -> ProbeResult:
    t = config.parse({"targets": {"t": {"unit": "llm.service", "url": f"unix:{path}", "api": "sglang"}}}).targets["t"]
    prober = Prober(t)
    try:
        return await prober.probe(main_pid)
    finally:
        await prober.close()


def _line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], DEADLINE)
    assert ready, "the server process did not answer in time"
    return proc.stdout.readline().strip()


def _peercred(s: socket.socket) -> int:
    pid: int = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[0]
    return pid


@pytest.mark.system
async def test_unix_socket_activation_is_proven_by_the_accepting_process(tmp_path: Path, unrelated_pid: int) -> None:
    """ListenStream=: the manager listens (here: this process), the unit's MainPID accepts and answers.
    SO_PEERCRED names the listener; the accepted end's holder is the unit's."""
    path = str(tmp_path / "activated.sock")
    with socket.socket(socket.AF_UNIX) as listener, socket.socket(socket.AF_UNIX) as client:
        listener.bind(path)
        listener.listen()
        unit = subprocess.Popen([sys.executable, "-c", ACTIVATED, str(listener.fileno())], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, pass_fds=(listener.fileno(),))
        try:
            r = await _probe_unix(path, unit.pid)  # as genready probes a unit with ListenStream=PATH
            assert r.ok and r.served_by_pid == unit.pid, r
            assert _line(unit) == "accepted"
            client.connect(path)
            assert _line(unit) == "accepted"
            inode = os.fstat(client.fileno()).st_ino
            assert _peercred(client) == os.getpid()  # the listener, not the process that answers
            o = owner.unix_owner(_peercred(client), unit.pid, inode)
            assert o == Owner(unit.pid, True, f"pid {unit.pid} (main)"), o
            o = owner.unix_owner(_peercred(client), unrelated_pid, inode)
            assert o.pid == unit.pid and not o.trusted and f"is not main pid {unrelated_pid}" in o.detail
        finally:
            unit.kill()
            unit.wait(DEADLINE)


@pytest.mark.system
async def test_unix_server_that_daemonized_is_proven_by_the_accepting_process(tmp_path: Path) -> None:
    """Type=forking: the process that listened exits; its child (the MainPID systemd then follows) serves."""
    path = str(tmp_path / "forking.sock")
    starter = subprocess.Popen([sys.executable, "-c", FORKING, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True)
    daemon = int(_line(starter))
    starter.wait(DEADLINE)  # the listener is gone
    try:
        r = await _probe_unix(path, daemon)
        assert r.ok and r.served_by_pid == daemon, r
        assert _line(starter) == "accepted"
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(path)
            assert _line(starter) == "accepted"
            listened = _peercred(client)
            assert listened == starter.pid and not os.path.exists(f"/proc/{listened}")
            o = owner.unix_owner(listened, daemon, os.fstat(client.fileno()).st_ino)
            assert o == Owner(daemon, True, f"pid {daemon} (main)"), o
    finally:
        os.kill(daemon, 9)
        assert starter.stdin is not None and starter.stdout is not None
        starter.stdin.close()
        starter.stdout.close()


@pytest.mark.system
def test_a_unit_with_listen_stream_is_verified(manager: UserManager, tmp_path: Path) -> None:
    """A real systemd socket unit (ListenStream=PATH): the manager listens, the service accepts on fd 3."""
    path = tmp_path / "activated.sock"
    script = tmp_path / "serve.py"
    script.write_text(SERVE + "serve(socket.socket(fileno=3))\n")
    manager.install_unit("to-activated.socket", f"[Socket]\nListenStream={path}\n")
    manager.install_unit("to-activated.service", f"[Service]\nExecStart={sys.executable} {script}\n"
                                                 f"StandardOutput=append:{tmp_path}/serve.log\n")
    manager.systemctl("start", "to-activated.socket")
    g = Genready(manager, tmp_path, {"t": {"unit": "to-activated.service", "url": f"unix:{path}",
                                           "backoff_initial": 0.05, "backoff_max": 0.3}}).start()
    try:
        with socket.socket(socket.AF_UNIX) as first:  # the first connection starts the service
            first.connect(str(path))
        wait_for(lambda: show(manager, "to-activated.service")[0], 10, "the service started by its socket")
        pid, _ = show(manager, "to-activated.service")
        wait_for(lambda: g.ready_pid("t") == pid, 20, lambda: f"verified: {g.status()['targets']['t']['last_error']}")
    finally:
        g.stop()
        manager.systemctl("stop", "to-activated.socket", "to-activated.service", check=False)
        manager.remove_unit("to-activated.service")
        manager.remove_unit("to-activated.socket")
