"""What kind of server a target runs (a `servers.kinds.ServerKind`), asked one way: `resolve`.

The target's `kind` key, when it names one. Else ("auto") the command line of the process that serves it,
as the kernel holds it (/proc/PID/cmdline: after systemd's expansion of `$VARS`, and the program a wrapper
script exec'd): the process that answered the probe, the MainPID, then the MainPID's descendants (a
wrapper that starts the server as its child). Else the unit's own ExecStart= words; else unknown. Every
place that needs the kind (the daemon's /status, the sweep's engine check) asks `resolve`, so the kind is
guessed in one place and the guess says where it came from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from genready.config import AUTO
from genready.probe.owner import cmdline, descendants
from genready.servers import kinds
from genready.vocab import KindSource

MAX_DESCENDANTS: Final = 64  # a wrapper's children looked at for the server: a launcher, not a process farm


@dataclass(frozen=True)
class TargetKind:
    """A target's kind, where it came from, and the command line that was read to say so."""

    kind: kinds.ServerKind | None
    source: KindSource
    pid: int | None = None  # the process whose command line was read (the server's, when one names a kind)
    argv: tuple[str, ...] = ()  # what the server was started with: its process's command line, else the unit's
    # expanded ExecStart= words; () when neither could be read
    argv_from: str = ""  # "process", "ExecStart" or "" (argv is empty)
    args: tuple[str, ...] | None = None  # the server's own arguments in argv, when argv names `kind`
    notes: tuple[str, ...] = ()  # what could not be read, and why

    def to_json(self) -> dict[str, object]:
        """/status's `kind` of a target."""
        return {"name": self.kind.name if self.kind else None, "from": str(self.source), "pid": self.pid}


def configured(name: str) -> kinds.ServerKind | None:
    """The kind a `kind` key names; None for "auto" (config.py checks the names)."""
    return kinds.BY_NAME.get(name)


def _serving_process(pids: Sequence[int]) -> tuple[int | None, list[str], tuple[kinds.ServerKind, list[str]] | None,
                                                      list[str]]:
    """(pid, its command line, the kind and arguments it names or None, notes): the first of `pids`, then the
    last one's descendants, whose command line names a kind; else the first readable one of `pids`."""
    notes: list[str] = []
    first: tuple[int, list[str]] | None = None
    for pid in pids:
        argv = cmdline(pid)
        if argv is None:
            notes.append(f"/proc/{pid}/cmdline cannot be read (the process is gone, or hidden from genready)")
            continue
        if (found := kinds.serving(argv)) is not None:
            return pid, argv, found, notes
        first = first or (pid, argv)
    if pids:
        for pid in descendants(pids[-1], MAX_DESCENDANTS):
            argv = cmdline(pid)
            if argv and (found := kinds.serving(argv)) is not None:
                return pid, argv, found, notes
    return (first[0], first[1], None, notes) if first else (None, [], None, notes)


def resolve(name: str = AUTO, *, pids: Sequence[int] = (), exec_start: Sequence[str] = (),
            unknown: Sequence[str] | None = None) -> TargetKind:
    """The kind of a target whose `kind` key is `name`, served by `pids` (the process that answered, then the
    MainPID; 0 and repeats skipped) and started by `exec_start` (the unit's last ExecStart= line: the one whose
    process systemd keeps as MainPID). `unknown`: None when those words are as written; else they are expanded
    as systemd expands them (systemd/unitexec.py's expand, by the caller: this module reads processes, not the
    bus) and these are the variables nothing set."""
    pids = list(dict.fromkeys(p for p in pids if p > 0))
    pid, argv, found, notes = _serving_process(pids)
    argv_from = "process" if argv else ""
    words_found: tuple[kinds.ServerKind, list[str]] | None = None
    words = list(exec_start)
    if words:
        if unknown:
            notes.append(f"the unit's ExecStart= uses ${', $'.join(unknown)}, which genready does not know")
        words_found = kinds.serving(words)
    if not argv and words and unknown is not None and not unknown:  # the words say what the server got
        argv, argv_from, found = words, "ExecStart", words_found
    wanted = configured(name)
    if wanted is not None:
        args = tuple(found[1]) if found and found[0] is wanted else None
        return TargetKind(wanted, KindSource.CONFIG, pid, tuple(argv), argv_from, args, tuple(notes))
    if found is not None and argv_from == "process":
        return TargetKind(found[0], KindSource.PROCESS, pid, tuple(argv), argv_from, tuple(found[1]), tuple(notes))
    if words_found is not None:
        args = tuple(words_found[1]) if argv_from == "ExecStart" else None
        return TargetKind(words_found[0], KindSource.EXEC_START, pid, tuple(argv), argv_from, args, tuple(notes))
    return TargetKind(None, KindSource.UNKNOWN, pid, tuple(argv), argv_from, None, tuple(notes))
