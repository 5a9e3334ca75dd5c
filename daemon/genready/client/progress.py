"""What a person watching a long load sees: one live line per target (`genready wait` and
`restart`), and the load column of `genready status` (`load_text`); times as timewords writes them.

On a terminal, `genready wait` and `restart` redraw one line per target in place:

    sglang  loading  pid 4242  3m10s of ~6m02s  [=======>      ]  ETA 2m52s  probe 17: refused

When stderr is not a terminal (a log, CI), a plain line is written at each change of state and
every PLAIN_EVERY seconds, never a control sequence. The lines are built from /ready's 503 answer
(state, pid, loading_seconds, expected_load_seconds, eta_seconds, probes, last_error).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Final, TextIO

from genready import console
from genready.redact import escape_tree
from genready.timewords import duration

PLAIN_EVERY: Final = 30.0  # seconds between plain progress lines when stderr is not a terminal
BAR_WIDTH: Final = 14


def bar(fraction: float, width: int = BAR_WIDTH) -> str:
    """[=======>      ]; full (no arrow) at or past 1."""
    f = min(max(fraction, 0.0), 1.0)
    done = int(f * width)
    inner = "=" * width if f >= 1 else "=" * done + ">" + " " * (width - done - 1)
    return f"[{inner}]"


def load_text(t: Mapping[str, Any]) -> str:
    """`3m10s of ~6m02s  [=====>   ]  ETA 2m52s`, or just `3m10s` without history ("" if not loading)."""
    elapsed, expected, eta = t.get("loading_seconds"), t.get("expected_load_seconds"), t.get("eta_seconds")
    if elapsed is None:
        return f"usually ~{duration(expected)}" if expected is not None else ""
    if expected is None or not expected:
        return duration(elapsed)
    left = f"ETA {duration(eta)}" if eta else "overdue"
    return f"{duration(elapsed)} of ~{duration(expected)}  {bar(elapsed / expected)}  {left}"


def target_line(t: Mapping[str, Any], width: int = 0) -> str:
    """One target's live line, from a /ready 503 body or a /status target."""
    parts = [str(t.get("target", "?")).ljust(width), str(t.get("state", "?")).ljust(8)]
    if t.get("pid"):
        parts.append(f"pid {t['pid']}")
    if load := load_text(t):
        parts.append(load)
    failed = t.get("start_failed")
    if isinstance(failed, dict) and t.get("state") in ("inactive", "starting"):
        code = f" {failed.get('exit_code')} {failed.get('exit_status')}" if failed.get("exit_code") else ""
        again = ", restarting" if failed.get("restarting") else ""
        parts.append(f"start {str(failed.get('invocation_id'))[:12]} failed: "
                     f"Result={failed.get('result')}{code}{again}")
        strays = [h for h in failed.get("gpu_strays") or [] if isinstance(h, dict)]
        if strays:  # the likely cause of a CUDA out-of-memory
            parts.append("GPU memory held by stray " + ", ".join(
                f"PID {h.get('pid')} ({str(h.get('command', ''))[:40]}) on {h.get('gpu')}" for h in strays))
    elif t.get("last_error"):
        parts.append(f"probe {t.get('probes')}: {str(t['last_error']).split(':', 1)[0]}")
    elif t.get("state") in ("inactive", "absent", "unknown", "stuck", "rejected") and t.get("reason"):
        parts.append(str(t["reason"]))
    return "  ".join(p for p in parts if p)


class LiveLines:
    """One line per target on `stream`: redrawn in place on a terminal, else plain lines at each
    change of state and every PLAIN_EVERY seconds."""

    def __init__(self, stream: TextIO, tty: bool | None = None, *, every: float = PLAIN_EVERY) -> None:
        self.stream = stream
        self.tty = stream.isatty() if tty is None else tty
        self.every = every
        self.drawn = 0  # lines on screen from the last redraw (terminal)
        self._states: dict[str, str] = {}
        self._last_plain = 0.0

    def show(self, targets: Sequence[Mapping[str, Any]]) -> None:
        # A probe's last error quotes the server (its reason phrase, its body): escaped, never a control
        # sequence of its own among the ones drawn here.
        targets = escape_tree(list(targets))
        width = max((len(str(t.get("target", ""))) for t in targets), default=0)
        lines = [target_line(t, width) for t in targets]
        if self.tty:
            out = f"\033[{self.drawn}F" if self.drawn else ""  # back to the first line drawn
            out += "".join(f"\033[K{line}\n" for line in lines) + "\033[J"  # and clear what is left below
            console.write(out, self.stream)
            self.drawn = len(lines)
        else:
            states = {str(t.get("target")): str(t.get("state")) for t in targets}
            changed = any(self._states.get(k) != v for k, v in states.items())
            self._states.update(states)
            if not (changed or time.monotonic() - self._last_plain >= self.every):
                return
            self._last_plain = time.monotonic()
            stamp = datetime.now().astimezone().strftime("%H:%M:%S")
            console.write("".join(f"{stamp} {line}\n" for line in lines), self.stream)

    def clear(self) -> None:
        """Remove the live lines (terminal) before a final answer is printed."""
        if self.tty and self.drawn:
            console.write(f"\033[{self.drawn}F\033[J", self.stream)
            self.drawn = 0
