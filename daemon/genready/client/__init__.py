"""The CLI's side of the daemon.

guard's limits live here, not in guard.py, so the CLI's --help can name them without
importing guard (subprocess, threading, urllib): `genready wait` in an ExecCondition= must
start fast (bench/cli_start.py).
"""

from typing import Final

GUARD_STOP_GRACE: Final = 10.0  # seconds a stopped command gets between the signal and SIGKILL
GUARD_MIN_INTERVAL: Final = 0.05  # seconds; a smaller --interval is raised to it (each check is a request)
