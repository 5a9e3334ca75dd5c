"""genready's exit statuses, defined once: the CLI's --help and the README's table come from here.

The numbers follow sysexits(3) where one fits, so shell scripts and systemd's
RestartPreventExitStatus= can tell a configuration error from a daemon that is down.
tests/test_exitcodes.py checks that the README's table says the same.
"""

from __future__ import annotations

import enum


class Exit(enum.IntEnum):
    OK = 0
    TIMEOUT = 1
    USAGE = 2
    BAD_ARGUMENT = 64  # EX_USAGE
    BAD_DATA = 65  # EX_DATAERR
    UNAVAILABLE = 69  # EX_UNAVAILABLE
    CANNOT_START = 71  # EX_OSERR
    CANNOT_CREATE = 73  # EX_CANTCREAT
    TEMPFAIL = 75  # EX_TEMPFAIL
    CONFIG = 78  # EX_CONFIG
    NOT_RUN = 127  # the shell's "command not found"
    INTERRUPTED = 130  # the shell's 128 + SIGINT


class Failed(Exception):
    """A command cannot go on: library modules raise it, the CLI prints it (and the hint) and exits
    with `status`. So no module below the CLI imports the CLI."""

    def __init__(self, msg: str, *, status: Exit, hint: str = "") -> None:
        super().__init__(msg)
        self.msg, self.status, self.hint = msg, status, hint


MEANING: dict[Exit, str] = {
    Exit.OK: "success (ready, config valid, …)",
    Exit.TIMEOUT: "timeout: the target did not become ready in time (wait, restart), or the start waited for "
                  "failed and systemd will not start the unit again (restart, wait --since); a point was not ok "
                  "(sweep); a probe failed (check-config --probe)",
    Exit.USAGE: "usage error",
    Exit.BAD_ARGUMENT: "a flag's value is not what it expects: sweep --shard, sweep --results with a control "
                       "character, bench client --random-input-len with "
                       "an API that takes no token ids (EX_USAGE)",
    Exit.BAD_DATA: "an input file is missing, empty or malformed: the bench client's --dataset, a folder without "
                   "results.jsonl given to sweep report; init: the unit runs no server it recognises (a template "
                   "to fill in is printed) (EX_DATAERR)",
    Exit.UNAVAILABLE: "the genready daemon is unreachable; init: the systemd manager is (EX_UNAVAILABLE)",
    Exit.CANNOT_START: "serve could not start: state_dir, runtime_dir or the listen address unusable (EX_OSERR)",
    Exit.CANNOT_CREATE: "sweep: the results folder cannot be created or written (a file, a dangling symlink, "
                        "read-only, full); the unit is restored first (EX_CANTCREAT)",
    Exit.TEMPFAIL: "not ready, or readiness changed while CMD ran (guard); the unit's drop-in belongs to another "
                   "running sweep (sweep, sweep restore) (EX_TEMPFAIL)",
    Exit.CONFIG: "invalid configuration or sweep plan (EX_CONFIG)",
    Exit.NOT_RUN: "guard could not run CMD",
    Exit.INTERRUPTED: "interrupted (Ctrl-C; sweep: SIGINT/SIGTERM, after cleaning up)",
}


def help_text() -> str:
    """The "exit status:" epilog of every `genready` subcommand's --help."""
    return "exit status:\n" + "".join(f"  {int(code):<3} {MEANING[code]}\n" for code in Exit)


def markdown_table() -> str:
    """The README's table, as it must read."""
    return "| code | meaning |\n|---|---|\n" + "".join(f"| {int(code)} | {MEANING[code]} |\n" for code in Exit)
