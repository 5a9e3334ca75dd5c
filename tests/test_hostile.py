"""genready on a hostile host: bad unit names, secrets and exposure, small ones (query digits,
bad requests, BOM, contradictory answers), exhausted file descriptors, full or read-only
directories, malformed answers from the server, interrupted D-Bus calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from genready import config
from genready.probe.probe import Prober
from genready.rule.gate import TargetGate
from genready.serve import api, httplimits, stamp
from genready.store import records
from genready.systemd.bus import retry_eintr
from genready.systemd.fresh import FreshReader
from genready.systemd.watcher import Watcher
from genready.vocab import Failure, ProbeResult
from genready_dev.harness import GENREADY, Genready, await_for, free_port, show, sim_unit, wait_for
from genready_dev.hostile import (
    FLAKY_SERVER,
    canned,
    closed_by_peer,
    fill,
    in_own_mounts,
    inside,
    metric,
    ns_run,
    raw_server,
    target_config,
    three_surfaces,
)
from genready_dev.usermanager import UserManager

GOOD_TARGET = '[targets.t]\nunit = "t.service"\nurl = "http://127.0.0.1:30000"\n'


def check_config(tmp_path: Path, text: str | bytes) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "genready.toml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    env = {k: v for k, v in os.environ.items() if k != "GENREADY_CONFIG"}
    return subprocess.run([*GENREADY, "check-config", "--config", str(path)], capture_output=True, text=True,
                          env=env, timeout=30, check=False)


# -- unit names as systemd judges them --------------------------------------------------------

@pytest.mark.parametrize(("unit", "why"), [
    ("foo@.service", "an instance of the template, e.g. foo@gpu0.service"),
    ("x" * 300 + ".service", "at most 255 characters"),
    ("@x.service", "a name before '@'"),
    ("sgl ang.service", "ASCII letters, digits"),
    ("sgläng.service", "without 'ä'"),
    (".service", "ending in .service"),
    ("sglang.socket", "ending in .service"),
])
@pytest.mark.system
def test_invalid_unit_names_are_refused_by_check_config(tmp_path: Path, unit: str, why: str) -> None:
    r = check_config(tmp_path, GOOD_TARGET.replace('"t.service"', json.dumps(unit)))
    assert r.returncode == 78, r.stderr
    assert "targets.t.unit: expected" in r.stderr and why in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("unit", ["a@b.service", "a@b@c.service", "x" * 247 + ".service",
                                  "sys-devices-x\\x2d1.service", "a:b_c-d.e.service"])
@pytest.mark.system
def test_names_systemd_accepts_pass(tmp_path: Path, unit: str) -> None:
    r = check_config(tmp_path, GOOD_TARGET.replace('"t.service"', json.dumps(unit)))
    assert r.returncode == 0, r.stderr


async def test_a_unit_systemd_refuses_is_that_targets_problem_only(manager: UserManager) -> None:
    """The watcher gets a per-unit D-Bus error for a name systemd rejects (config validation
    keeps such names out of `serve`; this is the defence behind it): the bus stays connected
    and the other unit is still followed."""
    good = "th-good.service"
    manager.install_unit(good, "[Service]\nExecStart=/bin/sleep infinity\n")
    manager.systemctl("start", good)
    seen: dict[str, Any] = {}
    w = Watcher("user", ["foo@.service", good], lambda unit, snap: seen.__setitem__(unit, snap))
    task = asyncio.create_task(w.run())
    try:
        # `connected` is set after the unit reads are applied (and their callbacks run): wait for it too.
        await await_for(lambda: w.connected and seen.get(good) is not None and seen[good].active_state == "active"
                        and "foo@.service" in seen, 20, lambda: f"both units read: {(w.connected, w.last_error, seen)}")
        assert seen[good].active_state == "active" and seen[good].main_pid > 0
        bad = seen["foo@.service"]
        assert bad is not None and bad.absent and bad.error, bad
        # A change of the good unit still arrives: the connection is the live one, not a reconnect loop.
        manager.systemctl("stop", good)
        await await_for(lambda: seen[good].active_state == "inactive", 20, lambda: f"{good} inactive: {seen[good]}")
        assert w.connected
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        manager.systemctl("stop", good)


# -- secrets and exposure ---------------------------------------------------------------------

@pytest.mark.parametrize("url", ["http://admin:pw@127.0.0.1:30000/", "http://admin@127.0.0.1:30000",
                                 "https://:secret@[::1]:8000/v1"])
@pytest.mark.system
def test_userinfo_in_url_is_refused_and_the_password_not_shown(tmp_path: Path, url: str) -> None:
    r = check_config(tmp_path, GOOD_TARGET.replace('"http://127.0.0.1:30000"', json.dumps(url)))
    assert r.returncode == 78, r.stderr
    assert "targets.t.url: expected a URL without user:password@" in r.stderr, r.stderr
    assert "pw" not in r.stderr and "secret" not in r.stderr and r.stdout == ""


@pytest.mark.parametrize(("listen", "warned"), [("0.0.0.0:9901", True), ("[::]:9901", True),
                                                ("192.0.2.1:9901", True), ("127.0.0.1:9901", False),
                                                ("[::1]:9901", False), ("localhost:9901", False)])
@pytest.mark.system
def test_check_config_warns_about_a_non_loopback_listen(tmp_path: Path, listen: str, warned: bool) -> None:
    r = check_config(tmp_path, f'[daemon]\nlisten = "{listen}"\n\n' + GOOD_TARGET)
    assert r.returncode == 0, r.stderr
    assert ("warning: daemon.listen" in r.stderr) is warned, r.stderr


def test_serve_warns_about_a_non_loopback_listen(manager: UserManager, tmp_path: Path) -> None:
    port = free_port()
    g = Genready(manager, tmp_path, {"t": {"unit": "th-none.service", "url": "http://127.0.0.1:1"}},
                 listen=f"0.0.0.0:{port}")
    g.port = port  # the helper's client side asks 127.0.0.1 at this port
    with g:
        wait_for(lambda: "is not a loopback address" in g.log(), 10, "the warning in the log")


def test_records_file_is_not_followed_through_a_symlink(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    state = tmp_path / "state"
    state.mkdir()
    (state / records.RECORDS_FILE).symlink_to(victim)
    store = records.RecordStore(state)
    with pytest.raises(OSError) as e:
        store.load()
    assert e.value.errno == 40  # ELOOP
    store.close()
    assert victim.read_text() == "precious\n"


@pytest.mark.system
def test_serve_refuses_a_symlinked_records_file_with_exit_71(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    state = tmp_path / "state"
    state.mkdir()
    (state / records.RECORDS_FILE).symlink_to(victim)
    cfg = tmp_path / "g.toml"
    cfg.write_text(f'[daemon]\nlisten = "127.0.0.1:{free_port()}"\nbus = "user"\nstate_dir = "{state}"\n'
                   f'runtime_dir = "{tmp_path / "run"}"\n\n' + GOOD_TARGET)
    r = subprocess.run([*GENREADY, "serve", "--config", str(cfg)], capture_output=True, text=True, timeout=30,
                       check=False)
    assert r.returncode == 71, r.stderr
    assert "Too many levels of symbolic links" in r.stderr and "Traceback" not in r.stderr
    assert victim.read_text() == "precious\n"


def test_stamp_write_replaces_a_planted_symlink_instead_of_following_it(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    run = tmp_path / "run"
    run.mkdir()
    stamp.stamp_path(run, "t").symlink_to(victim)
    stamp.write(run, "t", {"pid": 1})
    assert victim.read_text() == "precious\n"
    p = stamp.stamp_path(run, "t")
    assert not p.is_symlink() and json.loads(p.read_text()) == {"pid": 1}
    stamp.remove(run, "t")
    assert victim.exists()


# -- small ones -------------------------------------------------------------------------------

@pytest.mark.parametrize("query", [{"pid": "²"}, {"pid": "①"}, {"pid": "٣"}, {"pid": "1" * 5000},
                                   {"pid": "0"}, {"pid": " 12"}, {"pid": "+12"}, {"pid": "99999999"},
                                   {"wait": "٣"}, {"wait": "1" * 5000}, {"wait": "inf"}, {"wait": "nan"},
                                   {"wait": "-1"}, {"since": "²"}, {"since": "1e999"},
                                   {"invocation": "a" * 32 + "\n"}, {"invocation": "٣" * 32}])
def test_ready_query_takes_bounded_ascii_numbers_only(query: dict[str, str]) -> None:
    with pytest.raises(api.BadQuery) as e:
        api.parse_ready_query(query)
    assert len(str(e.value)) < 200  # a 5,000-digit value is not echoed back whole


@pytest.mark.parametrize(("query", "expected"), [
    ({"pid": "4242"}, {"pid": 4242}), ({"wait": "30"}, {"wait": 30.0}), ({"wait": "1.5"}, {"wait": 1.5}),
    ({"wait": "30.000"}, {"wait": 30.0}), ({"since": "1764571234.1234567"}, {"since": 1764571234.1234567}),
    ({"since": "1.7e9"}, {"since": 1.7e9}), ({"invocation": "AB" * 16}, {"invocation": "ab" * 16}),
])
def test_ordinary_queries_still_parse(query: dict[str, str], expected: dict[str, Any]) -> None:
    got = api.parse_ready_query(query)
    assert {k: got[k] for k in expected} == expected


def test_unicode_digits_answer_400_over_http(manager: UserManager, tmp_path: Path) -> None:
    with Genready(manager, tmp_path, {"t": {"unit": "th-none.service", "url": "http://127.0.0.1:1"}}) as g:
        for q in ("pid=%C2%B2", "pid=%E2%91%A0", "pid=%D9%A3", "pid=" + "1" * 5000, "wait=%D9%A3"):
            code, body = g.get("/ready?" + q)
            assert code == 400 and "ASCII" in body["error"], (q, code, body)
        assert "Traceback" not in g.log()


def test_a_malformed_request_logs_one_line(manager: UserManager, tmp_path: Path) -> None:
    with Genready(manager, tmp_path, {"t": {"unit": "th-none.service", "url": "http://127.0.0.1:1"}}) as g:
        before = g.log_path.stat().st_size
        for raw in (b"GET /ready HTTP/1.1\r\nHost: 127.0.0.1\r\nBad Header\r\n\r\n",
                    b"\x16\x03\x01\x02\x00\x01\r\n\r\n",
                    b"GET /ready HTTP/1.1\r\nContent-Length: -5\r\n\r\n"):
            with socket.create_connection(("127.0.0.1", g.port), timeout=5) as s:
                s.sendall(raw)
                s.recv(4096)
        assert g.get("/status")[0] == 200
        logged = g.log_path.read_bytes()[before:].decode(errors="replace")
        lines = [ln for ln in logged.splitlines() if "bad request" in ln or "Traceback" in ln
                 or "Error handling request" in ln]
        assert "Traceback" not in logged, logged
        assert 1 <= len(lines) <= 3, logged


@pytest.mark.system
def test_a_config_with_a_bom_says_so(tmp_path: Path) -> None:
    r = check_config(tmp_path, b"\xef\xbb\xbf" + GOOD_TARGET.encode())
    assert r.returncode == 78
    assert "byte-order mark (BOM)" in r.stderr, r.stderr


@pytest.mark.system
def test_more_targets_than_the_limit_is_exit_78(tmp_path: Path) -> None:
    text = "".join(f'[targets.t{i}]\nunit = "t{i}.service"\nurl = "http://127.0.0.1:{30000 + i}"\n'
                   for i in range(config.MAX_TARGETS + 1))
    r = check_config(tmp_path, text)
    assert r.returncode == 78 and f"at most {config.MAX_TARGETS} targets" in r.stderr, r.stderr
    path = tmp_path / "ok.toml"
    path.write_text(text.rsplit("[targets.", 1)[0])
    assert len(config.load(path).targets) == config.MAX_TARGETS


@pytest.mark.parametrize(("api_", "doc"), [
    ("sglang", {"text": "OK", "meta_info": {"completion_tokens": 0}}),
    ("sglang", {"text": "", "output_ids": [11], "meta_info": {"completion_tokens": 0}}),
    ("openai-completions", {"choices": [{"text": "OK"}], "usage": {"completion_tokens": 0}}),
    ("openai-chat", {"choices": [{"message": {"content": "OK"}}], "usage": {"completion_tokens": 0}}),
])
async def test_text_with_zero_completion_tokens_is_bad_response(api_: str, doc: dict[str, Any]) -> None:
    async for url in canned(json.dumps(doc).encode()):
        prober = Prober(target_config(url, api_))
        try:
            r = await prober.probe(0)
        finally:
            await prober.close()
        assert not r.ok and r.failure is Failure.BAD_RESPONSE and "contradiction" in r.detail, r


@pytest.mark.system
def test_exit_71_is_in_the_exit_code_tables() -> None:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert "| 71 |" in readme
    out = subprocess.run([*GENREADY, "--help"], capture_output=True, text=True, timeout=30, check=True).stdout
    assert "  71  " in out



# -- file descriptors any local user could exhaust ---------------------------------------------

def _limited(manager: UserManager, tmp_path: Path, nofile: int = 256) -> Genready:
    """A genready whose soft RLIMIT_NOFILE is small enough to flood from a test."""
    g = Genready(manager, tmp_path, {"t": {"unit": "th-none.service", "url": "http://127.0.0.1:1"}})
    g.wrapper = ["prlimit", f"--nofile={nofile}:4096", "--"]
    return g


def test_incomplete_requests_are_closed_within_the_read_timeout(manager: UserManager, tmp_path: Path) -> None:
    with _limited(manager, tmp_path) as g:
        socks = []
        for i in range(40):
            s = socket.create_connection(("127.0.0.1", g.port), timeout=5)
            # Half a request head (slowloris), or nothing at all.
            s.sendall(b"GET /ready HTTP/1.1\r\nHost: 127.0.0.1\r\n" if i % 2 else b"")
            s.setblocking(False)
            socks.append(s)
        t0 = time.monotonic()
        assert g.get("/status")[0] == 200  # served meanwhile
        wait_for(lambda: all(closed_by_peer(s) for s in socks), httplimits.REQUEST_READ_TIMEOUT + 5,
                 "every incomplete connection closed")
        took = time.monotonic() - t0
        for s in socks:
            s.close()
        assert took <= httplimits.REQUEST_READ_TIMEOUT + 3, took


def test_idle_connections_over_the_cap_make_room_for_real_requests(manager: UserManager,
                                                                         tmp_path: Path) -> None:
    cap = httplimits.connection_cap(1, 256)
    extra = 40
    with _limited(manager, tmp_path) as g:
        assert g.proc is not None
        fd0 = len(os.listdir(f"/proc/{g.proc.pid}/fd"))
        idle = []
        try:
            for _ in range(cap + extra):  # connections that never send a request
                s = socket.create_connection(("127.0.0.1", g.port), timeout=5)
                s.setblocking(False)
                idle.append(s)
            # A real request still gets its ordinary answer, not a 503 about the cap.
            code, body = g.get("/ready/t")
            assert code == 503 and body.get("state") == "absent", body
            # The oldest idle ones made room; genready's descriptors stay bounded by the cap.
            wait_for(lambda: all(closed_by_peer(s) for s in idle[:extra]), 5, "the oldest idle connections closed")
            assert len(os.listdir(f"/proc/{g.proc.pid}/fd")) <= fd0 + cap + 5
            assert metric(g, "genready_api_refused_total", why="evicted") >= extra
        finally:
            for s in idle:
                s.close()
        assert "Traceback" not in g.log()


def test_long_polls_over_the_cap_get_a_503(manager: UserManager, tmp_path: Path) -> None:
    limit = httplimits.connection_cap(1, 256) // 2
    with _limited(manager, tmp_path) as g:
        polls = []
        try:
            for _ in range(limit):
                s = socket.create_connection(("127.0.0.1", g.port), timeout=5)
                s.sendall(b"GET /ready/t?wait=60 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                polls.append(s)
            wait_for(lambda: g.get("/ready/t?wait=1")[0] == 503
                     and "too many long-polls" in str(g.get("/ready/t?wait=1")[1]), 10, "the long-poll cap")
            code, body = g.get("/ready/t")  # a question without wait= is still answered
            assert code == 503 and body["state"] == "absent", body
        finally:
            for s in polls:
                s.close()
        wait_for(lambda: g.get("/ready/t?wait=0.1")[1].get("state") == "absent", 10, "long-polls served again")


def test_a_ready_target_is_waited_for_at_once_with_every_long_poll_slot_held(manager: UserManager,
                                                                            tmp_path: Path) -> None:
    """Issue 41 #10: any local user can hold every long-poll slot (here: the limit's worth of
    `/ready/s?wait=3600&pid=1`). `genready wait` on a ready target still answers at once: the daemon
    answers readiness before it counts slots, and the client backs off a refusal instead of asking
    again at once (before: 20 s and 37,558 requests)."""
    unit = "th-slots.service"
    g = Genready(manager, tmp_path, {"s": _sim_target(manager, unit)})
    limit = httplimits.connection_cap(1) // 2
    with g:
        wait_for(lambda: g.get("/ready/s")[0] == 200, 20, "the start verified")
        held = []
        try:
            for _ in range(limit):
                c = socket.create_connection(("127.0.0.1", g.port), timeout=5)
                c.sendall(b"GET /ready/s?wait=3600&pid=1 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                held.append(c)
            wait_for(lambda: "too many long-polls" in str(g.get("/ready/s?wait=1&pid=1")[1]), 20, "every slot held")
            asked0 = sum(metric(g, "genready_ready_requests_total", code=c) for c in ("200", "503"))
            t0 = time.monotonic()
            run = subprocess.run([*GENREADY, "wait", "s", "--url", g.base, "--timeout", "30"], env=manager.env,
                                 capture_output=True, text=True, timeout=60, check=False)
            took = time.monotonic() - t0
            asked = sum(metric(g, "genready_ready_requests_total", code=c) for c in ("200", "503")) - asked0
            print(f"genready wait with {limit} long-polls held: rc {run.returncode} in {took:.2f} s, "
                  f"{asked:.0f} /ready answers")
            assert run.returncode == 0, run.stderr
            assert took < 5 and asked <= 2, (took, asked)
        finally:
            for c in held:
                c.close()


async def test_emfile_is_its_own_failure_class() -> None:
    """Out of descriptors is genready's trouble, not the server's: never "refused". The limit is
    lowered in this very process (restored after), so the EMFILE is real."""
    async for url in canned(b'{"text": "OK"}'):
        prober = Prober(target_config(url))
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 16, hard))
        filler: list[int] = []
        try:
            with contextlib.suppress(OSError):
                while True:  # every descriptor left, taken
                    filler.append(os.open("/dev/null", os.O_RDONLY))
            r = await prober.probe(0)
        finally:
            for fd in filler:
                os.close(fd)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            await prober.close()
        assert r.failure is Failure.LOCAL_RESOURCES and "EMFILE" in r.detail, r


# -- a full state_dir, a read-only runtime_dir --------------------------------------------------
# genready runs in a private mount namespace with a small tmpfs on each directory (unshare
# execs, so the PID is genready's); the test fills or remounts them with nsenter.

def _sim_target(manager: UserManager, unit: str) -> dict[str, Any]:
    port = free_port()
    manager.install_unit(unit, sim_unit(port, "--load-seconds", "0.3"))
    manager.systemctl("restart", unit)
    return {"unit": unit, "url": f"http://127.0.0.1:{port}", "backoff_initial": 0.05, "backoff_max": 0.3}


def _agree_on_new_pid(g: Genready, manager: UserManager, unit: str, old_pid: int) -> int:
    def verified_new() -> int | None:
        pid = show(manager, unit)[0]
        code, _ = g.get(f"/ready/s?pid={pid}")
        return pid if pid != old_pid and code == 200 and three_surfaces(g, "s") == (True, True, True) else None
    return wait_for(verified_new, 20, "the new start verified, on all three surfaces")


def test_a_full_state_dir_never_blocks_readiness(manager: UserManager, tmp_path: Path) -> None:
    unit = "th-full.service"
    g = Genready(manager, tmp_path, {"s": _sim_target(manager, unit)})
    in_own_mounts(g)
    try:
        with g:
            wait_for(lambda: g.get("/ready/s")[0] == 200, 20, "first start verified")
            pid0 = show(manager, unit)[0]
            fill(inside(g, g.state_dir))
            manager.systemctl("restart", unit)
            pid1 = _agree_on_new_pid(g, manager, unit, pid0)
            inv1 = show(manager, unit)[1]
            assert metric(g, "genready_record_errors_total") >= 1
            recs = g.records("s")
            assert recs[0]["invocation_id"] == inv1 and recs[0]["main_pid"] == pid1 and recs[0]["ready_at"]
            records_file = inside(g, g.state_dir / "records.jsonl")
            assert inv1 not in records_file.read_text()
            assert g.log().count("cannot write start records") == 1, g.log()
            # A second restart while still full: still verified, still logged only once.
            manager.systemctl("restart", unit)
            pid2 = _agree_on_new_pid(g, manager, unit, pid1)
            assert g.log().count("cannot write start records") == 1
            # Space again: the records catch up on disk.
            (inside(g, g.state_dir) / "filler").unlink()
            wait_for(lambda: inv1 in records_file.read_text() and show(manager, unit)[1] in records_file.read_text(),
                     10, "the records kept in memory written to disk")
            assert "start records are written" in g.log() and pid2 > 0
    finally:
        manager.systemctl("stop", unit)


def test_a_read_only_runtime_dir_never_splits_the_three_surfaces(manager: UserManager,
                                                                      tmp_path: Path) -> None:
    unit = "th-ro.service"
    g = Genready(manager, tmp_path, {"s": _sim_target(manager, unit)})
    in_own_mounts(g)
    try:
        with g:
            stamp_file = inside(g, stamp.stamp_path(g.runtime_dir, "s"))
            wait_for(lambda: g.get("/ready/s")[0] == 200 and stamp_file.exists(), 20, "first start verified")
            pid0 = show(manager, unit)[0]
            ns_run(g, "mount", "-o", "remount,ro", str(g.runtime_dir))
            manager.systemctl("restart", unit)
            pid1 = _agree_on_new_pid(g, manager, unit, pid0)
            assert metric(g, "genready_stamp_errors_total", target="s") >= 1
            assert json.loads(stamp_file.read_text())["pid"] == pid0  # stuck: nothing can remove it
            assert "cannot update the ready stamp" in g.log()
            ns_run(g, "mount", "-o", "remount,rw", str(g.runtime_dir))
            wait_for(lambda: json.loads(stamp_file.read_text())["pid"] == pid1, 10, "the stamp caught up")
            assert three_surfaces(g, "s") == (True, True, True)
            assert "ready stamp is up to date again" in g.log()
    finally:
        manager.systemctl("stop", unit)


# -- a malformed answer never kills probing -----------------------------------------------------

MALFORMED = {
    "negative chunk size": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\n",
    "0x chunk size": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n",
    "huge chunk size": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"f" * 40 + b"\r\n",
    "superscript Content-Length": b"HTTP/1.1 200 OK\r\nContent-Length: \xb2\r\n\r\nab",
    "4,300-digit Content-Length": b"HTTP/1.1 200 OK\r\nContent-Length: " + b"9" * 4300 + b"\r\n\r\n",
    "superscript status": b"HTTP/1.1 \xb2\xb2\xb2 OK\r\nContent-Length: 0\r\n\r\n",
    "Arabic-Indic status": "HTTP/1.1 ٢٠٠ OK\r\nContent-Length: 0\r\n\r\n".encode(),
}


@pytest.mark.parametrize("raw", MALFORMED.values(), ids=MALFORMED.keys())
async def test_a_malformed_answer_is_bad_response_not_an_exception(raw: bytes) -> None:
    async for url in raw_server(raw):
        prober = Prober(target_config(url, probe_timeout=3.0))
        try:
            r = await prober.probe(0)
        finally:
            await prober.close()
        assert not r.ok and r.failure is Failure.BAD_RESPONSE, r


def test_probing_goes_on_after_malformed_answers(manager: UserManager, tmp_path: Path) -> None:
    script = tmp_path / "flaky.py"
    script.write_text(FLAKY_SERVER)
    port = free_port()
    unit = "th-flaky.service"
    manager.install_unit(unit, f"[Service]\nExecStart={sys.executable} {script} {port}\n")
    manager.systemctl("restart", unit)
    try:
        with Genready(manager, tmp_path, {"f": {"unit": unit, "url": f"http://127.0.0.1:{port}",
                                                "backoff_initial": 0.05, "backoff_max": 0.2,
                                                "health_path": ""}}) as g:  # it serves only POSTs
            wait_for(lambda: g.get("/ready/f")[0] == 200, 20, "verified after the garbage")
            assert g.get("/ready/f")[1]["pid"] == show(manager, unit)[0]
            assert g.status()["targets"]["f"]["probes"] >= len(MALFORMED) - 3 + 1
            assert metric(g, "genready_probes_total", target="f", result="bad_response") == 4
            assert "Traceback" not in g.log()
    finally:
        manager.systemctl("stop", unit)


class _DiesOnce(Prober):
    """Stands in for a probe that raises: the real Prober now turns every exception into a
    result, so the supervisor behind it can only be shown with an injected fault."""

    calls = 0

    async def probe(self, main_pid: int, **kw: Any) -> ProbeResult:
        _DiesOnce.calls += 1
        if _DiesOnce.calls == 1:
            raise RuntimeError("injected: the probe task dies")
        return ProbeResult(True, None, "1 token(s)", main_pid, 0.001, 1)


class _Recorder:
    """The gate's Listener, keeping the PIDs of verified starts."""

    def __init__(self) -> None:
        self.verified_pids: list[int] = []

    def on_state_changed(self, gate: Any, old: Any, new: Any) -> None: ...
    def on_probed(self, gate: Any, result: ProbeResult) -> None: ...
    def on_revoked(self, gate: Any, reason: Any) -> None: ...
    def on_start_seen(self, gate: Any, record: Any) -> None: ...
    def on_settled(self, gate: Any) -> None: ...

    def on_verified(self, gate: Any, record: Any) -> None:
        self.verified_pids.append(record.main_pid)


async def test_a_probe_task_that_dies_is_restarted(manager: UserManager, tmp_path: Path,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    unit = "th-dies.service"
    manager.install_unit(unit, "[Service]\nExecStart=/bin/sleep infinity\n")
    manager.systemctl("restart", unit)
    fresh = FreshReader("user")
    listener = _Recorder()
    with records.RecordStore(tmp_path / "state") as store:
        cfg = target_config("http://127.0.0.1:1", unit=unit, backoff_initial=0.05, backoff_max=0.1)
        gate = TargetGate(cfg, store, fresh, listener, prober_factory=_DiesOnce)
        try:
            gate.on_snapshot(await fresh.read(unit))
            await await_for(lambda: gate.ready, 4, "ready after the probe loop's restart")
            assert gate.probe_restarts == 1 and listener.verified_pids == [show(manager, unit)[0]]
            assert "the probe loop died and is restarted" in caplog.text
        finally:
            await gate.close()
            fresh.close()
            manager.systemctl("stop", unit)


def test_event_loop_errors_are_logged_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    """asyncio reports accept() failing with EMFILE through the loop's exception handler on every
    retry; genready's handler logs the first, counts the rest, and says how many at the next line."""
    now = [0.0]
    handler = httplimits.LoopErrors(interval=60.0, clock=lambda: now[0])
    loop = asyncio.new_event_loop()
    try:
        emfile = OSError(24, "Too many open files")
        with caplog.at_level("ERROR", logger="genready.serve.api"):
            for _ in range(1000):
                handler(loop, {"message": "socket.accept() out of system resource", "exception": emfile})
                now[0] += 0.01  # 1,000 in 10 s
            now[0] = 61.0
            handler(loop, {"message": "socket.accept() out of system resource", "exception": emfile})
    finally:
        loop.close()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "Too many open files" in lines[0] and "and 999 more" in lines[1]
    assert not any(r.exc_info for r in caplog.records)  # an OSError is a line, not a traceback


def test_an_interrupted_dbus_call_is_retried_only_if_it_was_quick() -> None:
    """A signal during one of pystemd's blocking calls fails it with EINTR (pystemd raises an error
    whose errno is -4). A quick call is asked again; one already stuck on a dead bus is not, so
    SIGTERM reaches the event loop instead of waiting out another sd-bus timeout."""
    class Interrupted(Exception):
        errno = -errno.EINTR

    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise Interrupted("[err -4]: Interrupted system call")
        return "answer"

    assert retry_eintr(flaky) == "answer" and len(calls) == 2

    def stuck() -> str:
        time.sleep(0.05)  # stands for sd-bus waiting on a bus that does not answer
        raise Interrupted("[err -4]: Interrupted system call")

    with pytest.raises(Interrupted):
        retry_eintr(stuck, quick=0.01)

    def broken() -> str:
        raise OSError(errno.ECONNRESET, "reset")

    with pytest.raises(OSError):
        retry_eintr(broken)


def test_pystemds_interrupted_error_without_errno_is_retried() -> None:
    """pystemd raises DBusInterruptedError, an InterruptedError whose errno is None;
    the retry must go by the class, not the errno (15-24 of ~450 /ready polls failed under SIGHUP)."""
    from pystemd.dbusexc import DBusInterruptedError

    calls = []

    def interrupted_once() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise DBusInterruptedError(-errno.EINTR, b"System.Error.EINTR", b"Interrupted system call")
        return "answer"

    assert retry_eintr(interrupted_once) == "answer" and len(calls) == 2
    plain = InterruptedError("no errno")
    assert plain.errno is None
    calls.clear()

    def plain_once() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise plain
        return "answer"

    assert retry_eintr(plain_once) == "answer"
