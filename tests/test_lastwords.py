"""A failed start's own last lines (serve/lastwords.py), in-process: the gate of gatefakes.py and
real output files. The same against a real manager: test_failed_starts.py and test_loads.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from genready.serve import lastwords
from genready.serve.lastwords import LastWords
from genready.systemd.snapshot import Snapshot
from genready_dev.harness import await_for
from tests.gatefakes import UNIT, Rig


class FakeTime:
    """What lastwords reads of the `time` module: a wall clock the test steps, a monotonic one it advances."""

    def __init__(self) -> None:
        self.wall, self.mono = 1_800_000_000.0, 5_000.0

    def time(self) -> float:
        return self.wall

    def monotonic(self) -> float:
        return self.mono


def down(inv: str, **kw: Any) -> Snapshot:
    return Snapshot(UNIT, **{"load_state": "loaded", "active_state": "inactive", "sub_state": "dead",
                             "invocation_id": inv, **kw})


async def test_a_wall_clock_step_back_before_a_failed_start_keeps_only_its_lines(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeTime()
    monkeypatch.setattr(lastwords, "time", clock)
    out, frag = tmp_path / "u.out", tmp_path / "u.service"
    out.write_text("a line of an older start\n")
    frag.write_text(f"[Service]\nExecStart=/bin/false\nStandardOutput=append:{out}\n")
    rig = Rig(tmp_path / "rig")
    try:
        clock.wall -= 60  # genready started a minute ago
        lw = LastWords(rig.gate, "user")
        clock.wall += 60
        quiet = down("a" * 32, fragment_path=str(frag))
        rig.show(quiet)
        lw.follow(quiet)  # the unit is down: where its output stands is noted
        await await_for(lambda: lw._marks, 5, "the mark")
        # The wall clock steps back 100 s; 10 s later a start writes its lines and fails.
        clock.wall -= 100
        clock.wall += 10
        clock.mono += 10
        with out.open("a") as f:
            f.write("config: /models/typo does not exist\n")
        us = int(clock.wall * 1e6)
        failed = down("b" * 32, fragment_path=str(frag), active_state="failed", sub_state="failed",
                      exec_main_pid=4242, exec_main_start_us=us, exec_main_start_mono_us=int(clock.mono * 1e6),
                      exec_main_exit_us=us + 1000, inactive_enter_us=us + 2000,
                      inactive_enter_mono_us=int(clock.mono * 1e6) + 2000, exec_main_code=1, exec_main_status=3,
                      result="exit-code")
        rig.show(failed)
        lw.follow(failed)
        await await_for(lambda: lw.failure and lw.failure["journal"], 5, "the failed start's lines")
        assert lw.failure is not None
        assert lw.failure["journal"] == ["config: /models/typo does not exist"]  # not the older start's line
        assert lw.lines("b" * 32) == ["config: /models/typo does not exist"] and lw.lines("a" * 32) == []
    finally:
        lw.close()
        await rig.close()
