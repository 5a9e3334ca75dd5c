"""Issue 38 §3: don't load what cannot start. The pruning relation, the group order and the stop after failed
starts in-process (pure functions of prune.py), then whole sweeps on the simulator: configurations above a
size fail at load (`simulate --fail-load`, the way an out-of-memory load ends), and the larger ones are
recorded `skipped` with `pruned_by` instead of being loaded.
"""

from __future__ import annotations

import io
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from genready.compat import tomllib
from genready.config import ConfigError
from genready.sweep import main as sweep
from genready.sweep import plan as sweepplan
from genready.sweep.run import prune, runner, steps
from genready_dev.harness import GENREADY, PY
from genready_dev.usermanager import UserManager
from tests.test_sweep import Rig

DROPIN = '"[Service]\\nEnvironment=A={draft} B={topk} M={model}"'


def plan(text: str) -> sweepplan.Plan:
    return sweepplan.parse_plan(tomllib.loads(text), "plan.toml")


def pruned_plan(extra: str = "") -> sweepplan.Plan:
    # In file order largest first: the sweep must still meet the small configurations first.
    return plan(f'command = "x {{c}}"\ndropin = {DROPIN}\nprune = ["draft", "topk"]\n{extra}\n'
                '[matrix]\ndraft = [16, 4]\ntopk = [2, 1]\nmodel = ["a", "b"]\nc = [1, 2]')


def test_at_least_as_large_on_every_pruned_axis_and_equal_on_the_other_server_axes() -> None:
    axes, server = ("draft", "topk"), ("draft", "topk", "model")
    failed: dict[str, sweepplan.Scalar] = {"draft": 4, "topk": 2, "model": "a", "c": 1}

    def pruned(**other: sweepplan.Scalar) -> bool:
        return prune.at_least_as_large(failed, {**failed, **other}, axes, server)

    assert pruned() and pruned(draft=16) and pruned(draft=16, topk=4) and pruned(topk=2.5)
    assert pruned(c=8)  # a client-side axis does not change what is loaded
    assert not pruned(draft=2) and not pruned(draft=16, topk=1)  # smaller on one pruned axis: it may fit
    assert not pruned(draft=16, model="b")  # another model: another memory footprint


def test_groups_run_smaller_first_on_the_pruned_axes_keeping_the_plan_order_between_equals() -> None:
    p = pruned_plan()
    order = [(g[0].as_dict()["draft"], g[0].as_dict()["topk"], g[0].as_dict()["model"]) for g in p.groups()]
    assert order == [(4, 1, "a"), (4, 1, "b"), (4, 2, "a"), (4, 2, "b"),
                     (16, 1, "a"), (16, 1, "b"), (16, 2, "a"), (16, 2, "b")]
    assert all(len(g) == 2 for g in p.groups())  # the client-side axis stays inside its configuration
    unpruned = plan(f'command = "x {{c}}"\ndropin = {DROPIN}\n[matrix]\ndraft = [16, 4]\ntopk = [2, 1]\n'
                    'model = ["a"]\nc = [1]')
    assert [g[0].as_dict()["draft"] for g in unpruned.groups()] == [16, 16, 4, 4]  # no prune: the file's order


def test_a_failed_start_prunes_its_configuration_and_the_larger_ones_only() -> None:
    p = pruned_plan()
    pr = prune.Pruner(p.prune, p.server_axes, 3)
    failed = next(pt for pt in p.points if pt.as_dict() == {"draft": 4, "topk": 2, "model": "a", "c": 1})
    pr.add(failed, "exit-code")
    got = sorted((pt.as_dict()["draft"], pt.as_dict()["topk"], pt.as_dict()["model"], pt.as_dict()["c"])
                 for pt in p.points if pr.pruned_by(pt))
    # its own configuration's other point (c=2), and draft 16 at topk 2, model a
    assert got == [(4, 2, "a", 2), (16, 2, "a", 1), (16, 2, "a", 2)]
    src = pr.pruned_by(p.points[0] if p.points[0].as_dict()["topk"] == 2 else p.points[2])
    assert src is not None and src.to_json() == {"index": failed.index, "point": failed.as_dict(),
                                                 "unit_result": "exit-code"}
    assert pr.pruned_by(failed) is None  # it ran: its own line says what became of it
    off = prune.Pruner((), p.server_axes, 3)  # --no-prune
    off.add(failed, "exit-code")
    assert not any(off.pruned_by(pt) for pt in p.points)


def test_dry_run_lists_the_configurations_smaller_first_and_says_what_prune_does(tmp_path: Path) -> None:
    out = io.StringIO()
    assert sweep.dry_run(pruned_plan(), tmp_path, "u.service", "user", set(), out) == 0
    text = out.getvalue()
    assert "# prune = ['draft', 'topk']: smaller values first; a start that fails skips every configuration" in text
    firsts = [ln.split("] ", 1)[1].split("  (")[0] for ln in text.splitlines() if ln.startswith("[")]
    assert firsts[:3] == ["draft=4 topk=1 model=a c=1", "draft=4 topk=1 model=a c=2", "draft=4 topk=1 model=b c=1"]
    assert firsts[-1] == "draft=16 topk=2 model=b c=2"


@pytest.mark.parametrize(("extra", "key", "says"), [
    ('prune = "draft"', "prune", "an array of axis names"),
    ('prune = ["c"]', "prune[0]", "a server-side axis: one the drop-in uses (draft, topk, model), found 'c'"),
    ('prune = ["nope"]', "prune[0]", "a server-side axis"),
    ('prune = ["draft", "draft"]', "prune[1]", "each axis once"),
    ('prune = ["model"]', "prune[0]", "numbers (sizes that can be ordered) in every point, found 'a' in point 1"),
])
def test_a_bad_prune_key_names_file_key_expected_found(extra: str, key: str, says: str) -> None:
    with pytest.raises(ConfigError) as e:
        plan(f'command = "x {{c}}"\ndropin = {DROPIN}\n{extra}\n'
             '[matrix]\ndraft = [4]\ntopk = [1]\nmodel = ["a"]\nc = [1]')
    assert (e.value.file, e.value.key) == ("plan.toml", key) and says in str(e.value), str(e.value)
    with pytest.raises(ConfigError, match=r"prune\[0\]: expected a server-side axis: one the drop-in uses \(the "
                                          r"plan has none\)"):
        plan('command = "x {c}"\nprune = ["c"]\n[matrix]\nc = [1]')  # no drop-in: no server-side axis
    with pytest.raises(ConfigError, match="max_failed_starts: expected an integer >= 1, found integer 0"):
        plan('command = "x"\nmax_failed_starts = 0\n[matrix]\nc = [1]')


@pytest.mark.system
def test_a_bad_prune_key_exits_78(tmp_path: Path) -> None:
    (tmp_path / "plan.toml").write_text('command = "x"\ndropin = "[Service]\\nEnvironment=A={a}"\nprune = ["a"]\n'
                                        '[matrix]\na = ["big", "small"]\n')
    (tmp_path / "g.toml").write_text('[targets.t]\nunit = "x.service"\nurl = "http://127.0.0.1:1"\n')
    p = subprocess.run([*GENREADY, "sweep", str(tmp_path / "plan.toml"), "--results", str(tmp_path / "r"),
                        "--config", str(tmp_path / "g.toml")], capture_output=True, text=True, timeout=30)
    assert p.returncode == 78, p.stderr
    assert f"{tmp_path / 'plan.toml'}: prune[0]: expected an axis whose values are numbers" in p.stderr


def line(**kw: Any) -> dict[str, Any]:
    return {"status": "not_ready", "pid": None, "waited_seconds": 1.5, "unit_result": "exit-code",
            "journal": ["a", "b", "torch.OutOfMemoryError: CUDA out of memory"], "attempt": 1, **kw}


def test_a_failed_start_is_one_that_ended_before_it_was_verified() -> None:
    assert prune.failed_start(line()) == "exit-code"
    assert prune.failed_start(line(unit_result="oom-kill")) == "oom-kill"
    assert prune.failed_start(line(unit_result="success")) is None  # timed out: still loading, maybe slow
    assert prune.failed_start(line(waited_seconds=None)) is None  # a drop-in systemd refused: no start
    assert prune.failed_start(line(status="ok", pid=7)) is None


def test_failed_starts_in_a_row_stop_the_sweep_unless_keep_going() -> None:
    p = pruned_plan()
    pr = prune.Pruner(p.prune, p.server_axes, 3)
    a, b, c = p.points[:3]
    assert pr.started(line(), a) == "" and pr.started(line(), b) == ""
    assert pr.started({"status": "ok", "pid": 9, "restarted": True}, c) == ""  # a verified start ends the row
    assert pr.started(line(), a) == "" and pr.started(line(attempt=2), a) == ""
    stop = pr.started(line(unit_result="core-dump"), b)
    assert stop.startswith("3 starts in a row ended before they were verified (max_failed_starts = 3; "
                           "--keep-going goes on): point 1 (draft=16 topk=2 model=a c=1), attempt 1: exit-code; "
                           "last lines: a | b | torch.OutOfMemoryError: CUDA out of memory"), stop
    assert "attempt 2" in stop and "core-dump" in stop
    going = prune.Pruner(p.prune, p.server_axes, None)  # --keep-going
    assert not any(going.started(line(), a) for _ in range(10))


def test_resume_rederives_the_prunes_from_the_lines_of_the_same_configuration() -> None:
    p = pruned_plan()
    fps = {pt.index: {"dropin": str(pt.index)} for pt in p.points}
    one, two, three = p.points[:3]

    def rec(pt: sweepplan.Point, **kw: Any) -> dict[str, Any]:
        return line(**{"point": pt.as_dict(), "fingerprint": fps[pt.index], **kw})

    lines = [rec(one), rec(two), rec(two, status="ok", pid=3), rec(three, fingerprint={"dropin": "edited"}),
             rec(one, status="skipped", pid=None, waited_seconds=None)]
    # point 1: failed (a skipped line is no attempt); point 2: ok at last; point 3: made by another drop-in
    assert prune.earlier_failures(p.points, lines, fps) == {one.index: "exit-code"}


def test_the_eta_counts_the_loads_a_failed_start_saves(tmp_path: Path) -> None:
    p = pruned_plan()
    s = runner.Sweep(steps.SweepOptions(p, "http://127.0.0.1:1", "t", "u.service", "user", 1, tmp_path),
                     err=io.StringIO())
    s.plan_schedule(set())
    s.timings.load_times, s.timings.run_times = [300.0], [60.0]
    first = s.groups[0][0]
    assert s.eta(first, loading=True) == ", ETA 56m00s"  # 8 loads, 16 runs
    small = next(g[0] for g in s.groups if g[0].as_dict() == {"draft": 4, "topk": 2, "model": "a", "c": 1})
    s.pruner.add(small, "exit-code")
    s.plan_schedule(set())
    # 3 points pruned (draft 4 topk 2 model a c=2, draft 16 topk 2 model a): 7 loads, 13 runs
    assert s.eta(first, loading=True) == ", ETA 48m00s"
    assert s.loads_saved() == 2


# --- whole sweeps on the simulator ---------------------------------------------------------------

@pytest.fixture
def rig(manager: UserManager, tmp_path: Path) -> Iterator[Rig]:
    r = Rig(manager, tmp_path)
    yield r
    r.close()


def failing_above(rig: Rig, size: int) -> str:
    """A drop-in whose server fails at load (as an out-of-memory does) when draft x topk exceeds `size`."""
    return (f"[Service]\nExecStart=\nExecStart=/bin/sh -c 'size=$$(({{draft}} * {{topk}})); "
            f"[ $$size -gt {size} ] && f=--fail-load=size-$$size; exec {PY} -m genready.cli simulate "
            f"--port {rig.port} --load-seconds 0.2 --model m-{{draft}}-{{topk}} $$f'\n")


def test_larger_configurations_than_one_that_failed_are_skipped_not_loaded(rig: Rig) -> None:
    # 3 x 2 in descending file order; draft x topk > 4 fails: (4, 2) fails first, (8, 1) too.
    path = rig.write_plan({"draft": [8, 4, 2], "topk": [2, 1]}, dropin=failing_above(rig, 4), attempts=1,
                          prune=["draft", "topk"])
    rc, out = rig.run(path)
    err = rig.err.read_text()
    assert rc == 1, err
    got = [(ln["point"]["draft"], ln["point"]["topk"], ln["status"]) for ln in rig.results_lines()]
    assert got == [(2, 1, "ok"), (2, 2, "ok"), (4, 1, "ok"), (4, 2, "not_ready"), (8, 1, "not_ready"),
                   (8, 2, "skipped")], err
    failed, skipped = rig.results_lines()[3], rig.results_lines()[5]
    assert any("CUDA out of memory (size-8)" in x for x in failed["journal"]), failed
    # point 3 in the file (draft 8 and topk 2 come first there): run after every smaller configuration
    assert skipped["pruned_by"] == {"index": 3, "point": {"draft": 4, "topk": 2}, "unit_result": "exit-code"}
    assert skipped["pid"] is None and "not loaded: point 3 (draft=4 topk=2) failed to start" in skipped["reason"]
    ran = [json.loads(x) for x in rig.ran.read_text().splitlines()]
    assert [(r["draft"], r["topk"]) for r in ran] == [(2, 1), (2, 2), (4, 1)]
    assert "1 later points are not loaded" in err and "1 load saved so far" in err
    assert "3/6 points ok, 3 loads, 1 skipped (1 load saved by prune)" in out
    assert "skipped" in out
    rig.assert_restored()

    # --resume keeps the prunes: the failed starts are not loaded again, nor what they pruned.
    rc, out = rig.run(path, "--resume")
    err = rig.err.read_text()
    assert rc == 1 and "2 points whose start failed" in err, err
    assert [ln["status"] for ln in rig.results_lines()[6:]] == ["skipped"], err
    assert "not_ready (earlier run)" in out and "3/6 points ok, 0 loads" in out, out

    # --no-prune loads every one: the two failed starts again, and (8, 2) fails at load as well.
    rc, out = rig.run(path, "--resume", "--no-prune")
    got = [(ln["point"]["draft"], ln["point"]["topk"], ln["status"]) for ln in rig.results_lines()[7:]]
    assert rc == 1 and got == [(4, 2, "not_ready"), (8, 1, "not_ready"), (8, 2, "not_ready")], rig.err.read_text()
    rig.assert_restored()


def test_three_failed_starts_in_a_row_stop_the_sweep_naming_them_unless_keep_going(rig: Rig) -> None:
    # A broken setup: every start fails (no prune key: each configuration would be loaded).
    path = rig.write_plan({"draft": [1, 2, 4], "topk": [1, 2]}, dropin=failing_above(rig, 0))
    rc, _ = rig.run(path)
    err = rig.err.read_text()
    lines = rig.results_lines()
    # attempts = 2: point 1 twice, then point 2 once: three starts in a row, and the sweep stops
    assert rc == 1 and [(ln["index"], ln["attempt"]) for ln in lines] == [(1, 1), (1, 2), (2, 1)], err
    assert "3 starts in a row ended before they were verified (max_failed_starts = 3; --keep-going goes on): " \
           "point 1 (draft=1 topk=1), attempt 1: exit-code; last lines: " in err, err
    assert "CUDA out of memory (size-1)" in err and "point 2 (draft=1 topk=2), attempt 1" in err
    rig.assert_restored()

    (rig.results / "results.jsonl").unlink()
    rc, out = rig.run(path, "--keep-going")
    assert rc == 1 and len(rig.results_lines()) == 12 and "0/6 points ok" in out, rig.err.read_text()
    rig.assert_restored()
