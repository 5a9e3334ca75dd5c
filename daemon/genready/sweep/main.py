"""`genready sweep PLAN.toml --results DIR`: reconfigure, restart, verify, benchmark, record; per point.

A hand-written benchmark loop is where measuring the wrong server happens: a restart that
was not waited for, a result kept although the server changed under it. The sweep runs each
point of a plan with the guarantees of `genready restart` and `genready guard`:

1. the point's drop-in is written as a *runtime* drop-in of the target's unit (gone after a
   reboot, like `systemctl edit --runtime`) and the manager reloads over D-Bus;
2. the unit restarts over D-Bus, and the sweep waits, with the daemon, for a verified start
   newer than the restart (a start that fails, or crash-loops, is `not_ready` at once);
3. the command runs pinned to that verified instance (guard.run_pinned);
4. one fsync'd JSON line per attempt goes to DIR/results.jsonl.

Loading a large model takes minutes, so steps 1-2 happen once per *server configuration*:
points whose rendered drop-ins are byte-identical form a group (Plan.groups), and the later
points of a group reuse the group's verified instance if, checked right before their command
(guard.check), it is still that very instance and ready; otherwise that point restarts.
`--restart-each` restarts for every point (for cold-start measurements).

At the end, and on SIGINT/SIGTERM/SIGHUP, the drop-in is removed and the unit restarted on its
own configuration (unless --keep-config); a second signal exits at once, naming what is left.
The drop-in's header names the sweep that wrote it (pid, start, plan, results), so a leftover
of a sweep that was killed can be told from a running sweep's: `genready sweep restore TARGET`
removes it, and a second sweep of the same unit refuses to start while the first is alive.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import unicodedata
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Final, NoReturn, TextIO

from genready import console
from genready.client import GUARD_STOP_GRACE, client, guard, waiting
from genready.client.guard import check
from genready.client.progress import target_line
from genready.compat import StrEnum
from genready.config import Config, ConfigError, FileError, TargetConfig, stuck_after
from genready.exitcodes import Exit, Failed
from genready.redact import escape
from genready.store import durable
from genready.sweep import report as sweepreport
from genready.sweep.plan import Plan, Point, Scalar, Shard, load_plan
from genready.sweep.report import RESULTS_FILE, read_results
from genready.systemd import analyze, bus, control
from genready.systemd.snapshot import Snapshot
from genready.systemd.sweepdropin import DROPIN_NAME, describe_owner, owner_alive, owner_header, owner_of, read_dropin
from genready.systemd.unitlog import OutputMark
from genready.timewords import duration, iso
from genready.tools import servercache, servermetrics

LOCK_FILE: Final = ".sweep.lock"
POLL: Final = 0.5  # seconds: how quickly a failed start, or a signal, is noticed while waiting
# The grace an interrupted command gets between SIGINT, SIGTERM and SIGKILL: guard's, one definition.
STOP_GRACE: Final = GUARD_STOP_GRACE
LOADING_EVERY: Final = 30.0  # seconds between "loading" lines when stderr is not a terminal


class Cache(StrEnum):
    """What the server's prefix cache held when a run started (the `cache` of a results.jsonl line)."""

    COLD_START = "cold_start"  # the first run on a fresh start: only the warmup ran, and it was flushed if it can be
    FLUSHED = "flushed"  # a reused instance whose cache was emptied (servercache.flush) after the warmup
    WARM = "warm"  # a reused instance, not flushed (between_points = "none", or no route): figures biased


class Status(StrEnum):
    """What one attempt at one point came to (the `status` of a results.jsonl line)."""

    OK = "ok"  # the command exited 0 and the verified instance stayed ready throughout
    FAILED = "failed"  # the command exited non-zero (not retried: the server was fine)
    INVALIDATED = "invalidated"  # the server restarted or lost readiness during the run, or we were stopped
    NOT_READY = "not_ready"  # no verified start within the timeout, or the unit failed to start


RETRIED: Final = (Status.INVALIDATED, Status.NOT_READY)
STOP_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # SIGHUP: the terminal went away


class SweepError(Exception):
    """Something outside the plan stops the sweep (permissions, daemon, unit); the message says what."""


class SweepBusy(SweepError):
    """The unit's drop-in belongs to another sweep that is still running (exit 75)."""


class ResultsUnwritable(SweepError):
    """The results folder cannot be created or written (exit 73, EX_CANTCREAT); the unit is restored first."""


def unwritable(folder: Path, e: OSError) -> ResultsUnwritable:
    """`e` in words that name the results folder, and what is wrong with it when that is the cause."""
    if folder.is_symlink() and not folder.exists():
        why = f"it is a symlink to {os.readlink(folder)}, which does not exist"
    elif folder.exists() and not folder.is_dir():
        why = "it exists and is not a folder"
    else:
        why = e.strerror or str(e)
        if e.filename is not None and Path(os.fsdecode(e.filename)) != folder:
            why += f" ({os.fsdecode(e.filename)})"
    return ResultsUnwritable(f"cannot write the results folder {folder}: {why}")


@contextlib.contextmanager
def writing(folder: Path) -> Iterator[None]:
    """Turns an OSError of writing under the results folder into ResultsUnwritable (exit 73)."""
    try:
        yield
    except OSError as e:
        raise unwritable(folder, e) from None


def check_results_path(results: Path) -> str | None:
    """Why `results` cannot be the results folder's path, or None. Its path is written into drop-ins ({out}),
    where a line break would start a new directive (a `%` is doubled there, as any value's)."""
    bad = next((c for c in str(results) if unicodedata.category(c) in ("Cc", "Zl", "Zp")), None)
    if bad is not None:
        return f"--results: expected a path without control characters or line breaks, found {repr(bad)[1:-1]} in " \
            f"{shown(str(results))!r}"
    return None


# --- results.jsonl --------------------------------------------------------------------------------


def same_point(a: object, b: Mapping[str, Scalar]) -> bool:
    return isinstance(a, dict) and a == dict(b)


class ResultsLog:
    """DIR/results.jsonl, append-only: each line one write, fsync'd before `append` returns (store/durable.py).

    One sweep per DIR at a time (a lock file), so two sweeps never interleave their points.
    """

    def __init__(self, folder: Path) -> None:
        self.folder, self.path = folder, folder / RESULTS_FILE
        with writing(folder):
            folder.mkdir(parents=True, exist_ok=True)
            self._lock = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock)
            raise SweepError(f"another sweep is writing {folder}") from None
        try:
            with writing(folder):
                self._fd = durable.open_append(self.path, 0o644, read=True)
                durable.end_line(self._fd)  # a line torn by a crash must not glue itself to the next one
        except ResultsUnwritable:
            os.close(self._lock)
            raise

    def append(self, rec: Mapping[str, Any]) -> None:
        with writing(self.folder):
            durable.append(self._fd, (json.dumps(rec, ensure_ascii=True, separators=(",", ":")) + "\n").encode("ascii"))

    def close(self) -> None:
        for fd in (self._fd, self._lock):
            with contextlib.suppress(OSError):
                os.close(fd)


# --- running a sweep ------------------------------------------------------------------------------


@dataclass
class Attempt:
    """One try at one point, and what became of it (a results.jsonl line)."""

    point: Point
    attempt: int
    out: str  # relative to DIR
    group: int = 1  # the point's server configuration (1-based, in the order groups run)
    restarted: bool = True  # False: it ran on the instance verified for an earlier point of its group
    status: Status = Status.NOT_READY
    reason: str = ""
    pid: int | None = None
    invocation_id: str | None = None
    load_seconds: float | None = None
    exit_code: int | None = None
    started_at: float = field(default_factory=time.time)
    ran_at: float | None = None
    ended_at: float | None = None
    unit_result: str | None = None
    journal: list[str] | None = None
    retry: bool = True  # False: another attempt would meet the same refusal (systemd's, of the drop-in)
    repeat: int = 1  # which of the plan's `repeats` runs of the point
    cache: Cache = Cache.COLD_START
    noise_limit: float = 0.10
    counters: servermetrics.RunCounters | None = None  # the server's /metrics counters over the run
    plan: str = ""  # the plan file's path, for the report's context

    @property
    def run_seconds(self) -> float | None:
        return None if self.ran_at is None or self.ended_at is None else self.ended_at - self.ran_at

    def to_json(self, target: str, unit: str) -> dict[str, Any]:
        rec: dict[str, Any] = {
            "point": self.point.as_dict(), "status": self.status.value, "target": target, "unit": unit,
            "pid": self.pid, "invocation_id": self.invocation_id, "load_seconds": self.load_seconds,
            "exit_code": self.exit_code, "started_at": iso(self.started_at), "ended_at": iso(self.ended_at),
            "run_seconds": None if self.run_seconds is None else round(self.run_seconds, 3),
            "attempt": self.attempt, "out": self.out, "index": self.point.index, "group": self.group,
            "restarted": self.restarted, "host": socket.gethostname(), "repeat": self.repeat,
            "cache": self.cache.value, "noise_limit": self.noise_limit, "plan": self.plan,
        }
        if self.counters is not None:
            rec["prefix_cache_hit_rate"] = self.counters.prefix_cache_hit_rate
            rec["metrics_accept_length"] = self.counters.accept_length
            rec["counters_reset"] = bool(self.counters.reset)
        if self.reason:
            rec["reason"] = self.reason
        if self.status is Status.NOT_READY:
            rec["unit_result"] = self.unit_result
            rec["journal"] = self.journal or []
        return rec


class RestartRefused(Exception):
    """systemd refused to restart the unit on this point's configuration (its words)."""


class Interrupted(Exception):
    """A SIGINT or SIGTERM arrived: stop this point, clean up, exit."""


@dataclass(frozen=True)
class SweepOptions:
    """What `genready sweep` was asked to do: the plan, the target and its unit, where the results
    go, and the flags."""

    plan: Plan
    base: str  # the daemon's URL
    target: str
    unit: str
    bus_kind: str
    timeout: float  # seconds a point's start may take to be verified
    results: Path
    keep_config: bool = False
    restart_each: bool = False
    shard: Shard | None = None
    secrets: tuple[str, ...] = ()  # the target's own API key: masked in the unit's lines we keep
    server: TargetConfig | None = None  # the target: how the warmup, the flush and /metrics reach its server


@dataclass
class Timings:
    """What the ETA is computed from: this sweep's loads and runs, or before the first load the
    daemon's expected_load_seconds."""

    load_times: list[float] = field(default_factory=list)  # seconds from restart to verified
    expected_load: float | None = None  # the daemon's expected_load_seconds, until a load is timed
    run_times: list[float] = field(default_factory=list)  # seconds of ok commands
    last_load: float | None = None
    repeats: int = 1  # the plan's runs per point
    every_run_loads: bool = False  # --restart-each / between_points = "restart": each repeat is a fresh start

    def eta(self, schedule: Sequence[tuple[Point, bool]], point: Point, *, loading: bool) -> str:
        """Loads left times the expected load, plus runs left times the mean run (`schedule`: the
        points in order, True where a load is planned; each point is `repeats` runs, the current one
        counted whole). The expected load is the mean of this sweep's loads, or before the first one
        the daemon's expected_load_seconds (its recent loads of the unit); until a run is measured
        the ETA counts the loads alone, and says so."""
        load = sum(self.load_times) / len(self.load_times) if self.load_times else self.expected_load
        if load is None:
            return ""
        at = next((i for i, (p, _) in enumerate(schedule) if p.index == point.index), len(schedule))
        rest = schedule[at:]
        runs = len(rest) * self.repeats
        if self.every_run_loads:
            loads = runs - (0 if loading else 1)
        else:
            loads = sum(1 for _, first in rest[1:] if first) + (1 if loading else 0)
        if not self.run_times:
            return f", ETA > {duration(loads * load)} ({loads} load{'s' if loads != 1 else ''}, runs not yet timed)"
        return f", ETA {duration(loads * load + runs * sum(self.run_times) / len(self.run_times))}"


@dataclass
class UnitChanges:
    """What the sweep has changed on the unit: what the cleanup (or a second signal's last words) undoes."""

    dropin_path: Path | None = None
    dropin_written: bool = False
    restored: bool = True  # False from the first drop-in until the unit is verified on its own config


class Sweep:
    def __init__(self, opts: SweepOptions, *, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> None:
        self.opts = opts
        self.groups = opts.shard.take(opts.plan.groups()) if opts.shard else opts.plan.groups()
        self.started = time.time()
        self.out, self.err = out, err
        self.tty = err.isatty()
        self.width = len(str(len(opts.plan.points)))
        self.sd: control.UnitClient | None = None
        self.log: ResultsLog | None = None
        self.changes = UnitChanges()
        # The running command's process group (guard's runner): what it leaves behind is ended with it.
        self.child: guard.ProcessGroup | None = None
        self.pinned: dict[str, Any] = {}  # the verified instance the current command runs against
        self.signals = 0
        self.cleaning = False
        self.finished: dict[int, Attempt] = {}  # point index -> its last attempt in this run
        self.group_pinned: dict[str, Any] | None = None  # the verified instance of the running group
        self.check: analyze.DropinCheck | None = None  # systemd-analyze verify, when it can run
        self.schedule: list[tuple[Point, bool]] = []  # the points to run, in order; True: a planned load
        # between_points = "restart" is --restart-each: every run on a fresh start
        self.restart_each = opts.restart_each or opts.plan.between_points == "restart"
        self.timings = Timings(repeats=opts.plan.repeats, every_run_loads=self.restart_each)
        self.http = servercache.ServerHttp(opts.server) if opts.server is not None else None
        self.flush_told = False  # a server that cannot be flushed is said once
        self.metrics_told = False  # so is a server whose /metrics cannot be read
        self.records: list[dict[str, Any]] = []  # this run's results lines, for the summary
        self.done: dict[int, set[int]] = {}  # --resume: point index -> its repeats already ok
        self.earlier: dict[int, list[dict[str, Any]]] = {}  # --resume: those repeats' ok lines, for the summary
        self.runs: dict[int, dict[int, Attempt]] = {}  # point index -> repeat -> its last attempt in this run

    # -- signals ---------------------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signals += 1
        name = signal.Signals(signum).name
        if self.signals == 1:
            self.say(f"{name}: stopping{' the running command' if self.child else ''}, then cleaning up "
                     "(again to exit at once)")
            if self.child is not None:
                self.child.signal(signal.SIGINT)
            return
        self._exit_now(name)

    def _exit_now(self, name: str) -> NoReturn:
        left = []
        if self.child is not None:
            self.child.signal(signal.SIGKILL)
            left.append(f"the command (pid {self.child.child.pid}) was killed; its results are incomplete")
        ctl = "systemctl --user" if self.opts.bus_kind == "user" else "systemctl"
        if self.changes.dropin_path is not None and self.changes.dropin_path.exists():
            left.append(f"the drop-in {self.changes.dropin_path} is still in place: rm {self.changes.dropin_path} && "
                        f"{ctl} daemon-reload && genready restart {self.opts.target}")
        elif not self.changes.restored:
            left.append(f"{self.opts.unit} is on its own configuration again but its start was not verified: "
                        f"genready wait {self.opts.target}")
        self.say(f"{name} again: exiting at once. " + ("Left to clean up: " + "; ".join(left) if left else
                                                     "Nothing left to clean up."))
        os._exit(Exit.INTERRUPTED)

    def _check_signals(self) -> None:
        if self.signals and not self.cleaning:
            raise Interrupted()

    # -- output ----------------------------------------------------------------------------------

    def say(self, text: str) -> None:
        # console.write: a reader that went away (`genready sweep ... | head`) must not stop the sweep half-way,
        # with a point's configuration left on the unit.
        text = escape(text)  # it may quote a server's or systemd's words
        console.write(("\r\033[K" if self.tty else "") +
                      (f"genready sweep: {text}\n" if not text.startswith("[") else text + "\n"), self.err)

    def progress(self, point: Point, text: str, *, transient: bool = False) -> None:
        line = f"[{point.index}/{len(self.opts.plan.points)}] {shown(point.label)}: {text}"
        if transient and self.tty:
            console.write("\r\033[K" + line[:200], self.err)
        else:
            self.say(line)

    def eta(self, point: Point, *, loading: bool) -> str:
        return self.timings.eta(self.schedule, point, loading=loading)

    # -- the sweep -------------------------------------------------------------------------------

    def plan_schedule(self, skip: set[int]) -> None:
        """The points to run in order, each marked True where a load is planned (a group's first)."""
        self.schedule = [(p, self.restart_each or p is next(q for q in g if q.index not in skip))
                         for g in self.groups for p in g if p.index not in skip]

    def run(self, skip: set[int]) -> int:
        """Every point not in `skip`; then clean up. 0 if every point is ok, 1 if not, 130 if interrupted."""
        old = {s: signal.signal(s, self._on_signal) for s in STOP_SIGNALS}
        interrupted = False
        self.plan_schedule(skip)
        try:
            self.sd = control.UnitClient(self.opts.bus_kind, self.opts.unit)
            state = self.sd.state()
            if state.load_state != "loaded":
                raise SweepError(f"{self.opts.unit} is {state.load_state or 'unknown'} on the {self.opts.bus_kind} bus")
            self.changes.dropin_path = self.sd.dropin_path(self.opts.unit, DROPIN_NAME)
            self._check_plan(state, skip)  # before anything is touched: a refused drop-in is exit 78
            self.log = ResultsLog(self.opts.results)  # so is a results folder that cannot be written (73)
            self._take_over_leftover()
            for n, group in enumerate(self.groups, 1):
                self.group_pinned = None  # a new server configuration: its first point restarts
                for point in group:
                    if point.index not in skip:
                        self._point(point, n)
        except Interrupted:
            interrupted = True
        finally:
            self.cleaning = True
            try:
                self._cleanup()
            finally:
                if self.sd:
                    self.sd.close()
                if self.log:
                    self.log.close()
                for s, h in old.items():
                    signal.signal(s, h)
        self.summary(skip)
        if interrupted:
            return Exit.INTERRUPTED
        return Exit.OK if all(a.status is Status.OK for a in self.finished.values()) else Exit.TIMEOUT

    def _check_plan(self, state: Snapshot, skip: set[int]) -> None:
        """Every server configuration still to run, as systemd would read it (systemd-analyze verify). If it
        would take none as written, the plan is wrong: ConfigError naming the first point and systemd's words.
        If only some, those points will be recorded not_ready, with systemd's words (`_reconfigure`)."""
        if self.opts.plan.dropin is None:
            return
        assert self.changes.dropin_path is not None
        try:
            self.check = analyze.DropinCheck(self.opts.unit, state.fragment_path, self.changes.dropin_path,
                                             user=self.opts.bus_kind == "user")
        except analyze.CannotVerify as e:
            self.say(f"not checking the drop-ins with systemd-analyze verify: {e}")
            return
        points = [p for g in self.groups for p in g if p.index not in skip]
        distinct, refused = refused_dropins(self.opts.plan, points, self.opts.results, self.check.complaints)
        if not refused:
            return
        first = dropin_refused(self.opts.plan, *next(iter(refused.items())))
        if len(refused) == distinct:
            raise first
        self.say(f"systemd would not take the drop-in of {len(refused)} of {distinct} server configurations as "
                 f"written; their points will be recorded not_ready: {first}")

    def _take_over_leftover(self) -> None:
        """A drop-in already there: another live sweep's stops us (SweepBusy); a dead one's is replaced."""
        assert self.changes.dropin_path is not None
        try:
            text = read_dropin(self.changes.dropin_path)
        except FileNotFoundError:
            return
        except FileError as e:
            raise SweepError(f"{e}: not a drop-in a sweep wrote; remove it (genready sweep restore)") from None
        owner = owner_of(text)
        if owner is not None and owner.get("pid") != os.getpid() and owner_alive(owner):
            raise SweepBusy(f"{self.changes.dropin_path} belongs to a running {describe_owner(owner)}; two sweeps of "
                            f"{self.opts.unit} would change its configuration under each other")
        who = f" ({describe_owner(owner)}, gone)" if owner else ""
        self.say(f"{self.changes.dropin_path} was left by an earlier sweep{who}; replacing it")
        self.changes.dropin_written, self.changes.restored = True, False

    def _point(self, point: Point, group: int = 1) -> None:
        repeats = self.opts.plan.repeats
        for r in range(1, repeats + 1):
            if r in self.done.get(point.index, set()):
                continue  # --resume: this repeat is ok already
            if repeats > 1:
                self.progress(point, f"repeat {r} of {repeats}")
            for n in range(1, self.opts.plan.attempts + 1):
                att = self._attempt(point, n, group, r)
                runs = self.runs.setdefault(point.index, {})
                runs[r] = att
                # a point is ok when every repeat is: its first repeat that is not stands for it
                self.finished[point.index] = next((a for a in runs.values() if a.status is not Status.OK), att)
                if att.status in RETRIED:
                    self.group_pinned = None  # that instance is not to be trusted again: restart
                if att.status not in RETRIED or not att.retry or self.signals:
                    break
                if n < self.opts.plan.attempts:
                    self.progress(point, f"retrying ({n + 1} of {self.opts.plan.attempts} runs)")
            self._check_signals()

    def _folder(self, point: Point, repeat: int = 1) -> tuple[Path, int]:
        """A fresh folder for this attempt: DIR/NN-point/attempt-K (DIR/NN-point/repeat-R/attempt-K with
        repeats), K one past the last that exists."""
        base = self.opts.results / point.slug(self.width)
        if self.opts.plan.repeats > 1:
            base = base / f"repeat-{repeat}"
        k = 1
        while (base / f"attempt-{k}").exists():
            k += 1
        path = base / f"attempt-{k}"
        path.mkdir(parents=True)
        return path, k

    def _attempt(self, point: Point, n: int, group: int = 1, repeat: int = 1) -> Attempt:
        with writing(self.opts.results):
            folder, k = self._folder(point, repeat)
            (folder / "point.json").write_text(json.dumps(point.as_dict()) + "\n")
        att = Attempt(point, k, str(folder.relative_to(self.opts.results)), group, repeat=repeat,
                      noise_limit=self.opts.plan.noise_limit, plan=self.opts.plan.path)
        try:
            if not self._reuse(point, att, folder) and self._reconfigure(point, att, folder):
                self._restart_and_wait(point, att)
                if att.pid is not None and not self.restart_each:
                    self.group_pinned = self.pinned
            if att.pid is not None:
                self._prepare(point, att)
                self._run(point, att, folder)
        except Interrupted:
            att.status, att.reason = Status.INVALIDATED, "the sweep was interrupted"
            if att.ended_at is None:
                att.ended_at = time.time()
            self._record(att)
            raise
        att.ended_at = att.ended_at or time.time()
        self._record(att)
        return att

    def _reuse(self, point: Point, att: Attempt, folder: Path) -> bool:
        """Run on the group's verified instance if it is still that very instance and ready (as guard checks)."""
        if self.restart_each or self.group_pinned is None:
            return False
        why = check(self.opts.base, self.opts.target, self.group_pinned)
        if why:
            self.progress(point, f"the instance of this configuration is no longer usable ({why}); restarting")
            self.group_pinned = None
            return False
        text = self.opts.plan.dropin_for(point, str(folder))
        if text is not None:
            with writing(self.opts.results):
                (folder / "dropin.conf").write_text(text)  # the same configuration, kept with the results
        self.pinned = self.group_pinned
        att.started_at = time.time()
        att.restarted = False
        att.pid, att.invocation_id = self.pinned.get("pid"), self.pinned.get("invocation_id")
        att.load_seconds = self.pinned.get("load_seconds")
        return True

    def _prepare(self, point: Point, att: Attempt) -> None:
        """Before the command: the warmup (not counted), then, with between_points = "flush", the flush, so the
        warmup's prompts are gone too. Sets att.cache: what the run starts on."""
        att.cache = Cache.COLD_START if att.restarted else Cache.WARM
        plan, http = self.opts.plan, self.http
        if http is None:
            return
        if plan.warmup:
            ok, why = servercache.warm_up(http, plan.warmup)
            self.progress(point, f"warmup: {ok} of {plan.warmup} requests answered" + (f" ({why})" if why else ""))
        if plan.between_points != "flush" or (att.restarted and not plan.warmup):
            return  # a fresh start with no warmup has nothing to flush
        done = servercache.flush(http)
        if done.ok:
            if not att.restarted:
                att.cache = Cache.FLUSHED
            self.progress(point, f"prefix cache flushed ({done.route})")
        elif not self.flush_told:
            self.flush_told = True
            self.say(f"cannot flush the server's prefix cache: {done.why}; its reused points run warm "
                     f"(marked cache=warm): {servercache.FIX}")

    def _record(self, att: Attempt) -> None:
        assert self.log is not None
        rec = att.to_json(self.opts.target, self.opts.unit)
        self.records.append(rec)
        self.log.append(rec)
        took = f" in {duration(att.run_seconds)}" if att.run_seconds is not None else ""
        why = f": {att.reason}" if att.reason and att.status is not Status.OK else ""
        self.progress(att.point, f"{att.status.value}{took} (pid {att.pid or '-'}, attempt {att.attempt}){why}")

    def _reconfigure(self, point: Point, att: Attempt, folder: Path) -> bool:
        """Write and load the point's drop-in; False (att not_ready, not retried) if systemd would not take
        it as written: the unit is not touched then."""
        text = self.opts.plan.dropin_for(point, str(folder))
        if text is None:
            return True
        with writing(self.opts.results):
            (folder / "dropin.conf").write_text(text)
        complaints = self.check.complaints(text) if self.check else []
        if complaints:
            att.status, att.retry, att.journal = Status.NOT_READY, False, complaints
            att.reason = f"systemd would not take the drop-in as written: {complaints[0]}"
            return False
        self.changes.restored = False
        self._write_dropin(text)
        return True

    def _write_dropin(self, text: str) -> None:
        """The point's drop-in in place, headed by whose it is (sweepdropin), and the manager reloaded."""
        assert self.changes.dropin_path is not None and self.sd is not None
        try:
            self.sd.write_dropin(self.opts.unit, DROPIN_NAME,
                                 owner_header(self.opts.plan.path, self.opts.results, iso(self.started) or "") + text,
                                 written=self._written)
        except PermissionError as e:
            hint = (" (a runtime drop-in for a system unit needs root: run the sweep with sudo, or sweep a "
                    "user manager's unit)" if self.opts.bus_kind == "system" else "")
            raise SweepError(f"cannot write {self.changes.dropin_path}: {e.strerror}{hint}") from None

    def _written(self, path: Path) -> None:
        # Set before the reload: if that fails, the drop-in is in place all the same and the cleanup removes it.
        self.changes.dropin_written = True

    def _restart_and_wait(self, point: Point, att: Attempt) -> None:
        """Restart, then wait for a verified start newer than the restart (waiting.restart_and_wait, as
        `genready restart`); fills att: its pid, or not_ready with how the start ended and its last lines.
        Meanwhile only the daemon is asked: its 503 says when such a start ended before it was verified,
        and a crash loop (systemd restarting the unit itself) is no load to measure either."""
        assert self.sd is not None
        before = self.sd.state()
        mark = OutputMark.take(before.fragment_path, before.dropin_paths)
        att.started_at = time.time()
        last_line, last_state = time.monotonic(), ""

        def restart() -> None:
            assert self.sd is not None
            att.started_at = time.time()
            try:
                self.sd.restart()
            except Exception as e:
                if bus.denied(e):
                    raise SweepError(f"could not restart {self.opts.unit} on the {self.opts.bus_kind} bus: "
                                     f"{bus.dbus_words(e)} (restarting a system unit needs root or a polkit rule)"
                                     ) from None
                raise RestartRefused(bus.dbus_words(e)) from None
            self.progress(point, f"restarting {self.opts.unit}{self.eta(point, loading=True)}")

        def tick(code: int, body: Any) -> None:
            nonlocal last_line, last_state
            self._check_signals()
            expected = body.get("expected_load_seconds") if isinstance(body, dict) else None
            if isinstance(expected, int | float) and not isinstance(expected, bool):
                self.timings.expected_load = float(expected)
            now_state = str(body.get("state", "")) if isinstance(body, dict) else ""
            # a line every LOADING_EVERY seconds off a terminal, and at each change of state
            if time.monotonic() - last_line >= (1.0 if self.tty else LOADING_EVERY) or now_state != last_state:
                last_line, last_state = time.monotonic(), now_state
                if now_state:
                    # the daemon's own account: state, pid, time loading of the usual, ETA, last probe
                    text = target_line(body)
                else:
                    last = f" (last load {duration(self.timings.last_load)})" if self.timings.last_load else ""
                    text = f"{body.get('reason')}; loading for {duration(time.time() - att.started_at)}{last}"
                self.progress(point, f"{text}{self.eta(point, loading=True)}", transient=True)

        try:
            out = waiting.restart_and_wait(restart, self.opts.base, self.opts.target, self.opts.timeout,
                                           on_failure=waiting.OnFailure.ANY, poll=POLL, tick=tick)
        except RestartRefused as e:
            # systemd refused this configuration (a drop-in it cannot load, such as an empty ExecStart=):
            # the point's doing, not the sweep's. Another attempt would be refused the same way.
            state = self.sd.state()
            att.status, att.retry, att.unit_result = Status.NOT_READY, False, state.result
            att.reason = f"systemd refused to restart {self.opts.unit}: {e}"
            att.journal = [str(e)]
            return
        body = out.body
        if out.ready and isinstance(body, dict):
            att.pid, att.invocation_id = body.get("pid"), body.get("invocation_id")
            att.load_seconds = body.get("load_seconds")
            self.pinned = body
            self.timings.last_load = time.time() - att.started_at
            self.timings.load_times.append(self.timings.last_load)
            return
        if out.code in (400, 404):
            raise SweepError(f"the daemon refused: {body.get('error')} (is it running with this config?)")
        att.status = Status.NOT_READY
        failed = out.failed
        if failed is not None:
            how = waiting.failure_lines(failed)[0]
            att.reason = (f"{self.opts.unit} failed and systemd restarted it ({how})" if failed.get("restarting") else
                          f"{self.opts.unit} failed to start ({how})")
            att.unit_result = failed.get("result")
            att.invocation_id = failed.get("invocation_id")  # att.pid stays None: no instance to run on
            # The daemon's lines, once it has read them; else the sweep's own mark of the output files.
            att.journal = list(failed.get("journal") or []) or mark.lines(self.opts.bus_kind, self.opts.unit,
                                                                          secrets=self.opts.secrets)
            return
        detail = body.get("reason") or body.get("last_error") if isinstance(body, dict) else ""
        att.reason = f"no verified start within {self.opts.timeout:g}s" + (f" ({detail})" if detail else "")
        state = self.sd.state()
        att.unit_result = state.result
        att.pid, att.invocation_id = state.main_pid or None, state.invocation_id or None
        att.journal = mark.lines(self.opts.bus_kind, self.opts.unit, secrets=self.opts.secrets)

    def _run(self, point: Point, att: Attempt, folder: Path) -> None:
        if why := guard.stale_config(self.opts.target, self.pinned):
            # Its unit was edited and reloaded since it started: results would be filed under settings it does not run.
            att.ended_at = time.time()
            att.status, att.reason = Status.NOT_READY, why
            self.progress(point, f"not running the command: {why}")
            return
        cmd = self.opts.plan.command_for(point, str(folder))
        env = dict(os.environ, **guard.guard_env(self.opts.target, self.pinned),
                   GENREADY_SWEEP_POINT=json.dumps(point.as_dict()), GENREADY_SWEEP_OUT=str(folder))
        how = "started" if att.restarted else "reused"
        self.progress(point, f"ready pid {att.pid} ({how}, loaded in {att.load_seconds}s)"
                      f"{self.eta(point, loading=False)}; running {shlex.join(cmd)[:120]}")
        before = self._counters()
        att.ran_at = time.time()
        with contextlib.ExitStack() as files:
            with writing(self.opts.results):
                so = files.enter_context((folder / "stdout.log").open("wb"))
                se = files.enter_context((folder / "stderr.log").open("wb"))
            try:
                # Its own session: a Ctrl-C reaches the sweep, which stops the command once, on purpose.
                child = subprocess.Popen(cmd, env=env, stdout=so, stderr=se, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
            except OSError as e:
                att.ended_at = time.time()
                att.status, att.exit_code, att.reason = Status.FAILED, 127, f"cannot run {cmd[0]}: {e.strerror}"
                return
            # guard's runner: when the command exits, what it left in its group is ended before the next point.
            group = self.child = guard.ProcessGroup(child, STOP_GRACE)
            try:
                res = guard.run_pinned(self.opts.base, self.opts.target, self.pinned, child, wait=self._wait_child)
            finally:
                self.child = None
        if group.left_behind:
            self.progress(point, f"{cmd[0]} exited leaving {group.left_behind} process(es) in its process group; "
                          "they were ended (SIGTERM, then SIGKILL)")
        att.ended_at = time.time()
        att.exit_code = res.returncode
        if before is not None and not self.signals and (after := self._counters()) is not None:
            self._save_counters(point, att, folder, servermetrics.over_run(before, after))
        if self.signals:
            raise Interrupted()
        if res.problem:
            att.status, att.reason = Status.INVALIDATED, res.problem
        elif res.returncode != 0:
            att.status, att.reason = Status.FAILED, f"the command exited {res.returncode}"
        else:
            att.status = Status.OK
            self.timings.run_times.append(att.run_seconds or 0.0)

    def _counters(self) -> dict[str, float] | None:
        """The server's /metrics counters now; None (said once) when it has no readable page."""
        if self.http is None:
            return None
        status, body = self.http.get("/metrics")
        why = f"GET /metrics answered {status}" if status else body.decode("utf-8", "replace")[:200]
        if status == 200:
            try:
                return servermetrics.counters(body.decode("utf-8", "replace"))
            except servermetrics.NotMetrics as e:
                why = str(e)
        if not self.metrics_told:
            self.metrics_told = True
            self.say(f"no server counters per run: the server's /metrics cannot be read ({why}; llama-server "
                     "needs --metrics)")
        return None

    def _save_counters(self, point: Point, att: Attempt, folder: Path, run: servermetrics.RunCounters) -> None:
        att.counters = run
        with writing(self.opts.results):
            (folder / servermetrics.METRICS_FILE).write_text(json.dumps(run.to_json(), indent=1) + "\n")
        if run.reset:
            self.progress(point, f"the server's counters went down during the run ({', '.join(run.reset[:3])}): "
                          "it restarted; no server figures for this run")

    def _wait_child(self, child: subprocess.Popen[Any]) -> int:
        """The group's wait (the command, then what it left behind), but a signal to the sweep stops the
        command: SIGINT, then SIGTERM, then SIGKILL to its group, STOP_GRACE apart."""
        group = self.child
        assert group is not None and group.child is child
        stop_at: float | None = None
        escalate = iter((signal.SIGTERM, signal.SIGKILL))

        def tick() -> None:
            nonlocal stop_at
            if self.signals:
                now = time.monotonic()
                stop_at = stop_at or now
                if now - stop_at >= STOP_GRACE:
                    stop_at = now
                    with contextlib.suppress(StopIteration):
                        group.signal(next(escalate))

        return group.wait(tick=tick)

    def _cleanup(self) -> None:
        if self.sd is None or not self.changes.dropin_written:
            return
        o, dropin = self.opts, self.changes.dropin_path
        assert dropin is not None
        if o.keep_config:
            self.say(f"keeping {dropin} (--keep-config); {o.unit} runs the last point's configuration")
            return
        self.changes.restored = restore(self.sd, o.base, o.target, o.timeout, self.say, on_removed=self._removed)

    def _removed(self) -> None:
        self.changes.dropin_written = False

    # -- the summary -------------------------------------------------------------------------------

    def summary(self, skipped: set[int]) -> None:
        rows = []
        for p in self.opts.plan.points:
            a = self.finished.get(p.index)
            if a is None:
                if self.opts.shard is None or any(p in g for g in self.groups):
                    rows.append(sweepreport.Row(p.index, p.label, "ok (earlier run)" if p.index in skipped
                                                else "not run"))
                continue
            where = str(self.opts.results / RESULTS_FILE)
            lines = [(rec, self.opts.results, where) for rec in self.earlier.get(p.index, [])] + \
                [(rec, self.opts.results, where) for rec in self.records if rec["index"] == p.index]
            rows.append(sweepreport.point_row(lines))
        sweepreport.mark_best(rows)
        text = sweepreport.render(rows)
        ok = sum(1 for a in self.finished.values() if a.status is Status.OK) + len(skipped)
        n = sum(len(g) for g in self.groups)
        loads = len(self.timings.load_times)
        text += f"{ok}/{n} points ok" + (f" (shard {self.opts.shard})" if self.opts.shard else "") + \
            f", {loads} load{'s' if loads != 1 else ''}; results in {self.opts.results / RESULTS_FILE}\n"
        console.write(text, self.out)


def refused_dropins(plan: Plan, points: Sequence[Point], results: Path,
                    complaints: Callable[[str], list[str]]) -> tuple[int, dict[Point, list[str]]]:
    """(how many distinct drop-ins the points have, the first point of each that systemd would not take as
    written, with its words). Each distinct drop-in is checked once, rendered with `{out}` as DIR/OUT (the
    points' own folders do not exist yet)."""
    seen: set[str] = set()
    refused: dict[Point, list[str]] = {}
    for p in points:
        text = plan.dropin_for(p, str(results / "OUT"))
        if text is None or text in seen:
            continue
        seen.add(text)
        if said := complaints(text):
            refused[p] = said
    return len(seen), refused


def dropin_refused(plan: Plan, point: Point, complaints: Sequence[str]) -> ConfigError:
    """The plan error for a drop-in systemd would not take as written, in systemd's words."""
    return ConfigError(plan.path, "dropin", "unit file text systemd takes as written (systemd-analyze verify)",
                       f"for point {point.index} ({shown(point.label)}): " + " / ".join(complaints))


def restore(sd: control.UnitClient, base: str, target: str, timeout: float, say: Callable[[str], None], *,
            on_removed: Callable[[], None] | None = None) -> bool:
    """Remove the sweep's drop-in, reload, restart the unit on its own configuration and wait until that
    start is verified; True if it was. The end of every sweep, and `genready sweep restore`."""
    dropin = sd.remove_dropin(sd.unit, DROPIN_NAME)
    if on_removed:
        on_removed()
    say(f"removed {dropin}; restarting {sd.unit} on its own configuration")
    out = waiting.restart_and_wait(sd.restart, base, target, timeout, on_failure=waiting.OnFailure.ANY, poll=POLL)
    if out.ready and isinstance(out.body, dict):
        say(f"{sd.unit} is back on its own configuration: pid {out.body.get('pid')} verified")
        return True
    if out.failed is not None:
        first, *lines = waiting.failure_lines(out.failed)
        say(f"{sd.unit} failed to start on its own configuration ({first})")
        for line in lines:
            say(line)
        return False
    say(f"{sd.unit} restarted on its own configuration, not verified within {timeout:g}s")
    return False


# --- entry points -----------------------------------------------------------------------------------


def ok_runs(plan: Plan, results: Path) -> dict[int, list[dict[str, Any]]]:
    """The plan's points' `ok` lines already in DIR/results.jsonl, by point index (one per repeat, a line
    without `repeat` being repeat 1, from before repeats; repeats beyond the plan's are not counted)."""
    recs = read_results(results / RESULTS_FILE)
    out: dict[int, list[dict[str, Any]]] = {}
    for p in plan.points:
        seen: dict[int, dict[str, Any]] = {}
        for r in recs:
            rep = r.get("repeat", 1)
            if r.get("status") == Status.OK.value and same_point(r.get("point"), p.as_dict()) and \
                    isinstance(rep, int) and 1 <= rep <= plan.repeats:
                seen.setdefault(rep, r)
        if seen:
            out[p.index] = list(seen.values())
    return out


def ok_points(plan: Plan, results: Path) -> set[int]:
    """Indices of the plan's points whose every repeat already has an `ok` line in DIR/results.jsonl."""
    return {i for i, recs in ok_runs(plan, results).items() if len(recs) == plan.repeats}


def between_words(plan: Plan) -> str:
    """What happens before each run, in a line: the plan's between_points, warmup and repeats."""
    how = {"flush": "the server's prefix cache flushed through its own route before each run on a reused instance",
           "none": "no flush between points (reused points run warm)",
           "restart": "a fresh start for every run"}[plan.between_points]
    return f"{how}; {plan.warmup} warmup request{'s' if plan.warmup != 1 else ''} before each run" + (
        f"; {plan.repeats} repeats per point" if plan.repeats > 1 else "")


def loads_line(n_points: int, groups: Sequence[Sequence[Point]], restart_each: bool) -> str:
    """`8 points, 2 server configurations: 2 loads` (every point a load with --restart-each)."""
    loads = n_points if restart_each else len(groups)

    def n(k: int, word: str) -> str:
        return f"{k} {word}{'' if k == 1 else 's'}"
    return f"{n(n_points, 'point')}, {n(len(groups), 'server configuration')}: {n(loads, 'load')}" + \
        (" (--restart-each)" if restart_each else "")


def shown(text: str) -> str:
    """`text` for a terminal, one line per line systemd sees: systemd breaks lines at \\n only, so
    U+2028, U+0085 and other control characters (a terminal might break or act on them) are shown escaped."""
    return escape(text)


def dry_run(plan: Plan, results: Path, unit: str, bus_kind: str, skip: set[int], out: TextIO, *,
            restart_each: bool = False, shard: Shard | None = None,
            check: Callable[[str], list[str]] | None = None) -> int:
    """Print what the sweep would do, in the order it would do it; touch nothing. With `check`, each drop-in
    is checked as systemd would read it: 78 if systemd would not take one as written, else 0."""
    def w(text: str) -> None:
        console.write(text, out)  # `--dry-run | head` is not an error

    where = ("/run/systemd/system" if bus_kind == "system" else "$XDG_RUNTIME_DIR/systemd/user") + \
        f"/{unit}.d/{DROPIN_NAME}"
    width = len(str(len(plan.points)))
    groups = shard.take(plan.groups()) if shard else plan.groups()
    todo = [[p for p in g if p.index not in skip] for g in groups]
    todo = [g for g in todo if g]
    refused = refused_dropins(plan, [p for g in todo for p in g], results, check)[1] if check else {}
    w(f"# {loads_line(sum(map(len, todo)), todo, restart_each)}"
      + (f" (shard {shard}: {sum(map(len, groups))} of the plan's {len(plan.points)} points)" if shard else "")
      + f"; {len(skip)} already ok in {results / RESULTS_FILE}; drop-in: {where}\n")
    w(f"# {between_words(plan)}\n")
    if plan.between_points == "flush":
        # Said once, before anything runs: which routes a flush needs, and what a server without them gets.
        w(f"# a flush needs one of: SGLang /flush_cache; vLLM POST /reset_prefix_cache (only with "
          "VLLM_SERVER_DEV_MODE=1 in the server's environment); llama-server GET /slots and its slot actions "
          f"(--slot-save-path DIR, not --no-slots). A server without one runs its reused points warm (cache=warm): "
          f"{servercache.FIX}\n")
    for n, group in enumerate(groups, 1):
        w(f"\n## server configuration {n}: points {', '.join(str(p.index) for p in group)}\n")
        for i, p in enumerate(group):
            folder = results / p.slug(width) / "attempt-N"
            how = "restart" if restart_each or i == 0 else "reuse the verified instance, if still ready"
            w(f"\n[{p.index}/{len(plan.points)}] {shown(p.label)}" + (
                "  (ok earlier: skipped with --resume)" if p.index in skip else f"  ({how})") + "\n")
            text = plan.dropin_for(p, str(folder))
            if text is not None and (i == 0 or "out" in (plan.dropin.names if plan.dropin else [])):
                w("  drop-in:\n" + "".join(f"    {shown(ln)}\n" for ln in text.removesuffix("\n").split("\n")))
            if p in refused:
                w("  systemd would not take this drop-in as written:\n"
                  + "".join(f"    {shown(ln)}\n" for ln in refused[p]))
            w(f"  command: {shown(shlex.join(plan.command_for(p, str(folder))))}\n")
    if refused:
        first, said = next(iter(refused.items()))
        console.err(f"genready sweep: {dropin_refused(plan, first, said)}" + (
            f" (and {len(refused) - 1} more drop-ins)" if len(refused) > 1 else ""))
        return Exit.CONFIG
    return 0


def dry_run_check(plan: Plan, unit: str, bus_kind: str) -> Callable[[str], list[str]] | None:
    """The drop-in check for --dry-run (it only reads the unit's files), or None, saying why, if it cannot run."""
    if plan.dropin is None:
        return None
    sd = None
    try:
        sd = control.UnitClient(bus_kind, unit)
        state = sd.state()
        dropin = sd.dropin_path(unit, DROPIN_NAME)
        return analyze.DropinCheck(unit, state.fragment_path, dropin, user=bus_kind == "user").complaints
    except Exception as e:  # no manager to ask (D-Bus), no systemd-analyze: the dry run goes on unchecked
        console.err(f"genready sweep: not checking the drop-ins with systemd-analyze verify: {bus.dbus_words(e)}")
        return None
    finally:
        if sd is not None:
            sd.close()


def main(args: argparse.Namespace, cfg: Config, base: str) -> int:
    """`genready sweep`, called by the CLI with the parsed arguments, the config and the daemon's URL."""
    shard = None
    if args.shard is not None:
        try:
            shard = Shard.parse(args.shard)
        except ValueError as e:
            raise Failed(str(e), status=Exit.BAD_ARGUMENT) from None
    try:
        plan = load_plan(Path(args.plan))
    except ConfigError as e:
        raise Failed(str(e), hint="see `genready sweep --help` and docs/sweeps.md",
                     status=Exit.CONFIG) from None
    target = plan.target or (next(iter(cfg.targets)) if len(cfg.targets) == 1 else None)
    if target is None:
        raise Failed(f"the plan names no target and {cfg.path} has several: {', '.join(cfg.targets)}",
                     status=Exit.CONFIG)
    if target not in cfg.targets:
        raise Failed(f"{plan.path}: target: expected one of {', '.join(cfg.targets)}, found {target!r}",
                     status=Exit.CONFIG)
    tcfg = cfg.targets[target]
    results = Path(args.results)
    why = check_results_path(results)
    if why:
        raise Failed(why, status=Exit.BAD_ARGUMENT)
    done = ok_runs(plan, results) if args.resume else {}
    skip = {i for i, recs in done.items() if len(recs) == plan.repeats}
    restart_each = args.restart_each or plan.between_points == "restart"
    if args.dry_run:
        return dry_run(plan, results, tcfg.unit, cfg.daemon.bus, skip, sys.stdout, restart_each=restart_each,
                       shard=shard, check=dry_run_check(plan, tcfg.unit, cfg.daemon.bus))
    try:
        code, _ = client.request(base, f"/ready/{target}")
    except client.Unreachable as e:
        client.unreachable(base, e)
    if code == 404:
        raise Failed(f"the daemon at {base} has no target {target!r}", hint="is it running with this config?",
                     status=Exit.USAGE)
    sweep = Sweep(SweepOptions(plan, base, target, tcfg.unit, cfg.daemon.bus,
                               plan.timeout or stuck_after(tcfg.load_timeout, None), results,
                               keep_config=args.keep_config, restart_each=args.restart_each, shard=shard,
                               secrets=(tcfg.api_key,), server=tcfg))
    sweep.done = {i: {r.get("repeat", 1) for r in recs} for i, recs in done.items()}
    sweep.earlier = done
    todo = [[p for p in g if p.index not in skip] for g in sweep.groups]
    todo = [g for g in todo if g]
    sweep.say(loads_line(sum(map(len, todo)), todo, restart_each) + (f" (shard {shard})" if shard else "") +
              f"; {between_words(plan)}")
    if skip:
        sweep.say(f"--resume: {len(skip)} of {len(plan.points)} points already ok in {results / RESULTS_FILE}")
    partial = sum(1 for i, recs in done.items() if i not in skip)
    if partial:
        sweep.say(f"--resume: {partial} points have some of their {plan.repeats} repeats ok; only the missing "
                  "ones run")
    try:
        return sweep.run(skip)
    except ConfigError as e:  # a drop-in systemd would not take as written, found before anything changed
        raise Failed(str(e), hint="see `genready sweep --help` and docs/sweeps.md",
                     status=Exit.CONFIG) from None
    except ResultsUnwritable as e:
        raise Failed(str(e), hint="make room, or fix the folder, then run again with --resume: the points already "
                     "ok are kept", status=Exit.CANNOT_CREATE) from None
    except SweepBusy as e:
        raise Failed(str(e), hint="wait for it, or stop it (it restores the unit); if it hangs, kill it, then "
                     f"`genready sweep restore {target}`", status=Exit.TEMPFAIL) from None
    except (SweepError, control.NotOnUnitPath) as e:
        raise Failed(str(e), status=Exit.TIMEOUT) from None
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EPERM):
            raise Failed(f"{e}", hint="a system unit's runtime drop-in needs root", status=Exit.TIMEOUT) from None
        raise


def restore_main(target: str | None, cfg: Config, base: str, timeout: float | None) -> int:
    """`genready sweep restore TARGET`: put the unit back on its own configuration after a killed sweep."""
    target = target or (next(iter(cfg.targets)) if len(cfg.targets) == 1 else None)
    if target is None or target not in cfg.targets:
        raise Failed(f"name the target to restore; configured: {', '.join(cfg.targets)}", status=Exit.USAGE)
    unit = cfg.targets[target].unit

    def say(text: str) -> None:
        console.err(f"genready sweep restore: {text}")

    sd = control.UnitClient(cfg.daemon.bus, unit)
    try:
        dropin = sd.dropin_path(unit, DROPIN_NAME)
        try:
            owner = owner_of(read_dropin(dropin))
        except FileError:
            owner = None  # not one a sweep wrote as it is: removed like an unnamed one
        except FileNotFoundError:
            say(f"{unit} has no sweep drop-in ({dropin}); nothing to restore")
            return Exit.OK
        if owner is not None and owner_alive(owner):
            raise Failed(f"{dropin} belongs to a running {describe_owner(owner)}; it restores {unit} when it ends",
                         hint=f"stop it (kill -TERM {owner['pid']}) instead", status=Exit.TEMPFAIL)
        say(f"{dropin} was left by " + (f"{describe_owner(owner)}, gone" if owner else "an earlier sweep"))
        ok = restore(sd, base, target, timeout or stuck_after(cfg.targets[target].load_timeout, None), say)
    except Failed:
        raise
    except (SweepError, control.NotOnUnitPath) as e:
        raise Failed(str(e), status=Exit.TIMEOUT) from None
    except Exception as e:  # D-Bus: permission, no such unit
        raise Failed(f"could not restore {unit} on the {cfg.daemon.bus} bus: {e}",
                     hint="a system unit needs root (its runtime drop-in, its restart)", status=Exit.TIMEOUT) from None
    finally:
        sd.close()
    return Exit.OK if ok else Exit.TIMEOUT


def report_main(folders: Sequence[str], fmt: str, *, output: str | None = None, x: str | None = None,
                lines: str | None = None, compare: bool = False) -> int:
    """`genready sweep report DIR [DIR...]`: one table of every point's result and bench figures; with
    `--format html` a self-contained page with plots (sweephtml, which needs matplotlib: exit 69 without);
    with `--compare A B` two sweeps' points side by side (sweepcompare)."""
    if compare and (len(folders) != 2 or fmt not in ("table", "html")):
        raise Failed("--compare: expected two folders A B and --format table or html, found "
                     f"{len(folders)} folder{'s' if len(folders) != 1 else ''} and --format {fmt}",
                     status=Exit.BAD_ARGUMENT)
    try:
        sides = [sweepreport.rows_of([Path(f)]) for f in folders] if compare else []
        rows = [] if compare else sweepreport.rows_of([Path(f) for f in folders])
    except sweepreport.ReportError as e:
        raise Failed(str(e), status=Exit.BAD_DATA) from None
    if compare:
        from genready.sweep import compare as sweepcompare

        render = sweepcompare.render_html if fmt == "html" else sweepcompare.render_text
        text = render(sides[0], sides[1], folders[0], folders[1])
    elif fmt == "html":
        from genready.sweep import html as sweephtml  # matplotlib: only here, only when asked for

        try:
            text = sweephtml.render(rows, x=x, lines=lines)
        except sweephtml.NoMatplotlib as e:
            raise Failed(str(e), status=Exit.UNAVAILABLE) from None
        except ValueError as e:
            raise Failed(str(e), status=Exit.BAD_ARGUMENT) from None
    else:
        text = sweepreport.render(rows, fmt)
    if output is None:
        sys.stdout.write(text)
        return Exit.OK
    try:
        durable.replace(Path(output), text.encode())  # whole or not at all: a ticket gets no half page
    except OSError as e:
        raise Failed(f"cannot write {output}: {e.strerror or e}", status=Exit.CANNOT_CREATE) from None
    return Exit.OK
