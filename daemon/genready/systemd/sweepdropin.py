"""The sweep's drop-in and whose it is: shared by `genready sweep` (writes it, takes over or refuses a
leftover, `sweep restore`) and the daemon (warns about one whose sweep is gone).

A sweep killed with `kill -9` (or by the OOM killer) leaves its runtime drop-in in place, and the
unit runs that point's configuration until the next reboot. The drop-in's header therefore names
the sweep that wrote it: its PID and that process's start time (so a reused PID is not taken for
it), when it started, the plan and the results folder.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from genready.store import bounded

# Drop-ins from every directory are applied in file-name order, whatever directory they sit in:
# "zz-" sorts after the usual "NN-name.conf" and "name.conf", so the point's settings win.
DROPIN_NAME: Final = "zz-genready-sweep.conf"
OWNER_TAG: Final = "# genready-sweep-owner "  # then one JSON object: pid, pid_start, started, plan, results


def proc_start(pid: int) -> int | None:
    """The start time of `pid` in clock ticks since boot (/proc/PID/stat field 22), or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    try:
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (IndexError, ValueError):
        return None


def owner_header(plan: str, results: Path, started: str) -> str:
    """The first lines of a drop-in this process writes (`started`: when, ISO 8601): who wrote it, for people
    and for owner_of()."""
    me = {"pid": os.getpid(), "pid_start": proc_start(os.getpid()), "started": started,
          "plan": os.path.abspath(plan), "results": os.path.abspath(results)}
    # A file name may hold any byte but "/" and NUL: a line break in the plan's name would end the comment
    # and start a directive of its own. Every name goes in as a JSON string, ASCII only (DEL too).
    return (f"# written by genready sweep (pid {me['pid']}, started {_js(started)}) for the plan {_js(me['plan'])}, "
            f"results in {_js(me['results'])};\n# removed when that sweep ends. If it is gone: genready sweep "
            f"restore TARGET\n{OWNER_TAG}{_js(me)}\n")


def _js(v: object) -> str:
    """`v` as JSON with every character outside printable ASCII escaped: safe in a unit file's comment."""
    return json.dumps(v).replace("\x7f", "\\u007f")


MAX_DROPIN_BYTES: Final = 1 << 20


def read_dropin(path: str | Path) -> str:
    """A drop-in's text, through the one bounded reader. FileNotFoundError if it is not there;
    bounded.FileError for anything that is not a regular file of at most MAX_DROPIN_BYTES."""
    return bounded.read_file(path, MAX_DROPIN_BYTES).decode(errors="replace")


def owner_of(text: str) -> dict[str, Any] | None:
    """The sweep named in a drop-in's header, or None (no header: an older genready wrote it)."""
    for line in text.splitlines():
        if line.startswith(OWNER_TAG):
            try:
                doc = json.loads(line[len(OWNER_TAG):])
            except ValueError:
                return None
            return doc if isinstance(doc, dict) and isinstance(doc.get("pid"), int) else None
    return None


def owner_alive(owner: Mapping[str, Any]) -> bool:
    """Is the sweep that wrote the drop-in still running (the same process, not a reused PID)?"""
    start = proc_start(int(owner["pid"]))
    return start is not None and (owner.get("pid_start") is None or owner.get("pid_start") == start)


def describe_owner(owner: Mapping[str, Any]) -> str:
    return (f"sweep pid {owner.get('pid')} (started {owner.get('started')}), plan {owner.get('plan')}, "
            f"results {owner.get('results')}")


@dataclass(frozen=True)
class Leftover:
    """A sweep drop-in among a unit's DropInPaths whose sweep is gone."""

    path: str
    owner: dict[str, Any] | None

    def warning(self, unit: str, target: str) -> str:
        o = self.owner
        who = f"plan {o.get('plan')}, sweep pid {o.get('pid')} gone" if o else "its sweep unnamed (an older genready)"
        return (f"{unit} runs the configuration of an interrupted sweep ({self.path}, {who}); "
                f"restore it with: genready sweep restore {target}")


def names_a_sweep_dropin(dropin_paths: Sequence[str]) -> bool:
    """Cheap (no I/O): is one of the unit's drop-ins the sweep's?"""
    return any(os.path.basename(p) == DROPIN_NAME for p in dropin_paths)


def leftover(dropin_paths: Sequence[str]) -> Leftover | None:
    """The sweep drop-in among `dropin_paths` if the sweep that wrote it is gone (reads the file and /proc)."""
    for p in dropin_paths:
        if os.path.basename(p) != DROPIN_NAME:
            continue
        try:
            owner = owner_of(read_dropin(p))
        except OSError:
            return None  # removed meanwhile: nothing left over
        except bounded.FileError:
            return Leftover(p, None)  # not the sweep's file as written: named, for restore to remove
        return None if owner is not None and owner_alive(owner) else Leftover(p, owner)
    return None
