"""The only place that talks to systemd: D-Bus through pystemd and, for what must never wait,
libsystemd through ctypes (sdbus); sd_notify (notify); `systemd-analyze` (analyze) and unit
output files or `journalctl` (unitlog). tests/test_layout.py checks that no other package does.

**pystemd keeps the GIL while sd-bus waits for an answer** (0.11 and 0.15 alike; seen with gdb:
the main thread in take_gil, the worker in sd_bus_call's ppoll). A pystemd call stuck on a frozen
manager (SIGSTOPped, PID 1 busy in a long daemon-reload) stops every thread of genready, its
event loop included, even from a worker thread. Every design choice below follows from that:

- `/ready`'s reads and the heartbeat go through `sdbus` on the event loop (`fresh`): sent without
  blocking, answered when they come, never waited on;
- the watcher's pystemd calls run on a `worker.Worker`, and each call that waits for the manager
  is preceded by `Worker.answering()` (a Version question through sdbus, GIL released): a manager
  that does not answer is not asked;
- before pystemd connects, `bus.check_bus` asks the bus socket with a plain socket;
- the daemon's sd-bus method timeout is SD_BUS_TIMEOUT (5 s), the bound on the one window left
  (a freeze between `answering()` and the call).

Modules: `bus` (connecting and calling), `snapshot` (a unit's properties), `worker` (the
watcher's thread, `Health`), `watcher`, `fresh`, `sdbus`, `control` (the blocking client for the
CLI and the sweep), `unitexec`, `unitlog`, `notify`, `sweepdropin`, `analyze`.
"""
