"""The one harness for tests, benchmarks and the demo: deadlines, ports, a private systemd, genready.

Everything that waits goes through `wait_for(predicate, timeout, what)` (`await_for` on an event
loop): a poll with a deadline that fails naming what it waited for, never a fixed sleep. `booted_manager()` is the
one way to boot a private `systemd --user` (usermanager.py); `Genready` runs `genready serve`
against it as a real process; `sim_unit` writes a unit that runs the simulator. A test's helper
process starts, is waited for and stops through `ChildProcess` (`Simulator`: `genready simulate`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar, overload

import tomli_w

from genready_dev.usermanager import UserManager, unavailable_reason

T = TypeVar("T")
C = TypeVar("C", bound="ChildProcess")
REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
GENREADY = [PY, "-m", "genready.cli"]


def stop_process(proc: subprocess.Popen[Any], grace: float = 10.0, sig: int = signal.SIGTERM) -> int:
    """`sig` (SIGTERM), then SIGKILL if it is still there after `grace` seconds; its exit status."""
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        return proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(grace)


class ChildProcess:
    """A helper process of a test (a simulator, llama-server, Prometheus): started with its output in
    `log`, waited for until `ready()` holds (an AssertionError with its log if it exits first or the
    deadline passes), and stopped with stop_process; a `with` block stops it too."""

    def __init__(self, argv: list[str], log: Path, *, env: dict[str, str] | None = None) -> None:
        self.log = log
        with log.open("ab") as out:
            self.proc: subprocess.Popen[bytes] = subprocess.Popen(argv, stdout=out, stderr=out,
                                                                  stdin=subprocess.DEVNULL, env=env)

    def log_text(self, tail: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-tail:]

    def wait_ready(self, ready: Callable[[], object], what: str, timeout: float = 20.0) -> None:
        """Until `ready()` is truthy; stops the process and fails, with its log, if it never is."""
        try:
            wait_for(lambda: ready() or self.proc.poll() is not None, timeout, what)
            assert self.proc.poll() is None, f"{what}: it exited ({self.proc.returncode}); its log:\n{self.log_text()}"
        except BaseException:
            self.stop()  # a failed start must not leave a process behind
            raise

    def stop(self, grace: float = 10.0, sig: int = signal.SIGTERM) -> int:
        return stop_process(self.proc, grace, sig)

    def __enter__(self: C) -> C:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Simulator(ChildProcess):
    """`genready simulate FLAGS` on a free loopback port (`--port` is added), its lifecycle lines in a
    file under `tmp`; returns once it says it is ready."""

    def __init__(self, tmp: Path, *flags: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        super().__init__([*GENREADY, "simulate", "--port", str(self.port), *flags], tmp / f"sim-{self.port}.log",
                         env={**os.environ, **env} if env else None)
        self.wait_ready(lambda: " ready" in self.log.read_text(), "the simulator's ready line")


class LlamaServer(ChildProcess):
    """llama.cpp's llama-server (`binary`, genready_dev.realservers builds it) with ARGS on a free
    loopback port, its output in a file under `tmp`; returns once its /health answers 200."""

    def __init__(self, tmp: Path, binary: Path, *args: str, timeout: float = 60.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        super().__init__([str(binary), "--host", "127.0.0.1", "--port", str(self.port), "-lm", "none", *args],
                         tmp / f"llama-server-{self.port}.log")
        self.wait_ready(lambda: http(self.url + "/health")[0] == 200, "llama-server's /health 200", timeout)


def wait_for(predicate: Callable[[], T | None], timeout: float = 20.0, what: str | Callable[[], str] = "condition",
             interval: float = 0.02) -> T:
    """Poll `predicate` until it returns something truthy (and return that); AssertionError
    naming `what` (a text, or a function that says it at the deadline) and the last value."""
    deadline = time.monotonic() + timeout
    while True:
        last = predicate()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise _timed_out(timeout, what, last)
        time.sleep(interval)


@overload
async def await_for(predicate: Callable[[], Awaitable[T | None]], timeout: float = ...,
                    what: str | Callable[[], str] = ..., interval: float = ...) -> T: ...
@overload
async def await_for(predicate: Callable[[], T | None], timeout: float = ...,
                    what: str | Callable[[], str] = ..., interval: float = ...) -> T: ...
async def await_for(predicate: Callable[[], Any], timeout: float = 20.0,
                    what: str | Callable[[], str] = "condition", interval: float = 0.02) -> Any:
    """`wait_for` on an event loop: the loop runs between polls. `predicate` may be a coroutine
    function (an HTTP request, say); an exception it raises counts as "not yet" only if it is one
    of `OSError`'s kind (a connection refused), and is then the last value shown."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = predicate()
            last: object = await got if inspect.isawaitable(got) else got
        except OSError as e:
            last = e
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            raise _timed_out(timeout, what, last)
        await asyncio.sleep(interval)


def _timed_out(timeout: float, what: str | Callable[[], str], last: object) -> AssertionError:
    said = what if isinstance(what, str) else what()
    return AssertionError(f"timed out after {timeout}s waiting for {said} (last: {last!r})")


def alive(pid: int) -> bool:
    """Is `pid` a live process (not gone, not a zombie waiting to be reaped)?"""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:].split()[0] != b"Z"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, below the kernel's ephemeral range: a port
    from that range (bind to port 0) can be taken, before its server binds it, as the source port of
    any outgoing connection, this process's or a parallel test worker's (seen under pytest-xdist)."""
    low = _ephemeral_low()
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(10000, low) if low > 11000 else 0
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            got: int = s.getsockname()[1]
            return got
    raise RuntimeError(f"no free TCP port on 127.0.0.1 in 10000-{low - 1}")


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's default is 32768)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def code_paths() -> list[Path]:
    """Where this interpreter and genready's code live (the checkout holds the venv and the
    editable install). A sandboxed test unit must see them wherever the checkout is: under
    /tmp, PrivateTmp= hides it; under /root or /home, ProtectHome= does."""
    paths = sorted({REPO, Path(sys.base_prefix).resolve()})
    return [p for p in paths if not any(p != q and p.is_relative_to(q) for q in paths)]


def http(url: str, timeout: float = 5.0) -> tuple[int, Any]:
    """(status, JSON body or text); status 0 when the connection fails."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            raw = r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        raw, status = e.read(), e.code
    except OSError as e:
        return 0, str(e)
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


# A one-token generation in SGLang's native API (what the simulator serves).
GEN_BODY = json.dumps({"text": "hi", "sampling_params": {"max_new_tokens": 1}}).encode()


def answers_ok(url: str, post: bool = False, timeout: float = 2.0) -> bool:
    """Does `url` answer 200 (POSTing GEN_BODY when `post`)? Any failure is False."""
    req = urllib.request.Request(url, data=GEN_BODY if post else None, method="POST" if post else "GET",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def pct(xs: list[float], p: float) -> float:
    """The p-th percentile by nearest rank (nan for no data), as the benchmarks report it."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(p / 100 * len(xs) + 0.5) - 1))] if xs else float("nan")


def genready_service(config: Path, log: Path, extra: str = "") -> str:
    """`genready serve --config CONFIG` as a Type=notify unit text for a private manager, its
    output appended to `log`; `extra` lines go at the end of [Service]."""
    return f"""[Unit]
Description=genready under test
StartLimitIntervalSec=0

[Service]
Type=notify
NotifyAccess=main
ExecStart={PY} -m genready.cli serve --config {config}
ExecReload=/bin/kill -HUP $MAINPID
TimeoutStopSec=10
StandardOutput=append:{log}
StandardError=append:{log}
{extra}
"""


@contextlib.contextmanager
def booted_manager(root: Path | None = None, *, set_env: bool = False) -> Iterator[UserManager]:
    """A private systemd user manager for the `with` block, stopped (units and all) after it.

    RuntimeError if it cannot run here (callers decide: skip, fail, or say why). With
    `set_env`, this process's XDG_RUNTIME_DIR and DBUS_SESSION_BUS_ADDRESS point at it for the
    block, so in-process pystemd (user_mode) finds its bus.
    """
    reason = unavailable_reason()
    if reason:
        raise RuntimeError(f"no private systemd user manager here: {reason}")
    um = UserManager(root)
    um.start()
    keys = ("XDG_RUNTIME_DIR", "DBUS_SESSION_BUS_ADDRESS")
    saved = {k: os.environ.get(k) for k in keys}
    if set_env:
        for k in keys:
            os.environ[k] = um.env[k]
    try:
        yield um
    finally:
        um.stop()
        if set_env:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def sim_unit(port: int, *flags: str, restart: str = "no", extra: str = "") -> str:
    """A unit file running the simulator, output kept in a file (there is no journald here)."""
    args = " ".join(["--port", str(port), *flags])
    return f"""[Unit]
StartLimitIntervalSec=0

[Service]
ExecStart={PY} -m genready.cli simulate {args}
Restart={restart}
RestartSec=0.1
TimeoutStopSec=30
{extra}
"""


def show(um: UserManager, unit: str) -> tuple[int, str]:
    """(MainPID, InvocationID) as systemctl reports them."""
    p = um.show(unit, "MainPID", "InvocationID")
    return int(p["MainPID"]), p["InvocationID"]


def env_without_notify() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("NOTIFY_SOCKET", None)
    return env


class Genready:
    """`genready serve` as a subprocess against a test manager's bus, with its own config."""

    def __init__(self, um: UserManager, tmp: Path, targets: dict[str, dict[str, Any]], **daemon: Any) -> None:
        self.um = um
        self.tmp = tmp
        self.port = free_port()
        self.state_dir = tmp / "state"
        self.runtime_dir = tmp / "runtime"
        self.config_path = tmp / "genready.toml"
        cfg = {
            "daemon": {"listen": f"127.0.0.1:{self.port}", "bus": "user", "state_dir": str(self.state_dir),
                       "runtime_dir": str(self.runtime_dir), "log_level": "debug", **daemon},
            "targets": targets,
        }
        self.config_path.write_text(tomli_w.dumps(cfg))
        self.log_path = tmp / "genready.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.wrapper: list[str] = []  # a command genready runs under, e.g. ["prlimit", "--nofile=256:4096"]

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Genready:
        env = self.um.env
        env.pop("NOTIFY_SOCKET", None)
        with self.log_path.open("ab") as log:
            argv = [*self.wrapper, *GENREADY, "serve", "--config", str(self.config_path)]
            self.proc = subprocess.Popen(argv, env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        try:
            # Following systemd, not only answering: a unit change made after start() returns is seen.
            wait_for(lambda: self._following() or self._dead(), 20, "genready's /status with bus_connected")
            assert self.proc.poll() is None, f"genready exited: {self.log()}"
        except BaseException:
            self.stop()  # a failed start must not leave a daemon behind
            raise
        return self

    def _following(self) -> bool:
        code, body = self.get("/status")
        return code == 200 and isinstance(body, dict) and body.get("bus_connected") is True

    def _dead(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, Any]:
        return http(self.base + path, timeout)

    def ready_pid(self, target: str) -> int | None:
        """The verified pid /ready/TARGET names, or None while it answers anything but 200."""
        code, body = self.get(f"/ready/{target}")
        return int(body["pid"]) if code == 200 else None

    def status(self) -> dict[str, Any]:
        code, body = self.get("/status")
        if code == 0 and self.proc is not None and self.proc.poll() is None:
            # Unanswered: have the daemon dump its stacks (faulthandler on SIGUSR1) for the report.
            self.proc.send_signal(signal.SIGUSR1)
            time.sleep(0.3)  # not synchronisation: gives the dump a moment to reach the log
            raise AssertionError(f"genready did not answer /status ({body}); its log:\n{self.log()}")
        assert code == 200, body
        assert isinstance(body, dict)
        return body

    def records(self, target: str) -> list[dict[str, Any]]:
        recs: list[dict[str, Any]] = self.status()["targets"][target]["records"]
        return recs

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self, sig: int = signal.SIGTERM) -> int:
        return 0 if self.proc is None else stop_process(self.proc, 10, sig)

    def __enter__(self) -> Genready:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
