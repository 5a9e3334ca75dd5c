"""`genready sweep`: the plan's rules in-process, then whole sweeps against simulator units in the
private systemd user manager, with a real genready daemon verifying every start.

The point commands are a small script (written per test) that records what it saw: its
GENREADY_* environment, the /v1/models answer of the server and the command line of the
verified PID, read from /proc. The unit's stderr goes to a file (StandardError=append:):
there is no journald here, and the sweep takes a failed start's lines from that file.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import pytest
import tomli_w

from genready.compat import tomllib
from genready.config import ConfigError
from genready.sweep import main as sweep
from genready.sweep import plan as sweepplan
from genready.sweep.report.main import report_main
from genready.sweep.run import lines as sweeplines
from genready.sweep.run import results as sweepresults
from genready.sweep.run import runner, steps
from genready.sweep.run.dropin import DropinLife
from genready.systemd import sweepdropin
from genready_dev.harness import GENREADY, PY, REPO, Genready, alive, free_port, show, wait_for
from genready_dev.usermanager import UserManager
from tests.jsonserver import JsonServer, in_turn

FAST = {"backoff_initial": 0.05, "backoff_max": 0.3, "probe_timeout": 2.0}
UNIT = "sw-sim.service"

# --- the plan, in-process ------------------------------------------------------------------------


def plan(text: str) -> sweepplan.Plan:
    return sweepplan.parse_plan(tomllib.loads(text), "plan.toml")


def test_the_shipped_example_plan_parses() -> None:
    p = sweepplan.load_plan(REPO / "units" / "examples" / "sweep-spec-decoding.toml")
    assert len(p.points) == 8 and p.target == "sglang"
    text = p.dropin_for(p.points[-1], "/o")
    assert text is not None and "--speculative-num-steps 5 \\\n    --speculative-eagle-topk 4" in text


def test_matrix_in_file_order_then_points_and_placeholders() -> None:
    p = plan('''
command = "bench --budget {budget} --topk {topk} --out {out} --lit {{x}} --env ${HOME} $USER"
dropin = """
[Service]
Environment=SPEC_BUDGET={budget} SPEC_TOPK={topk} OTHER=${KEEP} $$ {{}}
"""
[matrix]
budget = [8, 16, 32]
topk = [4, 8]
[[points]]
budget = 64
topk = 1
''')
    assert [pt.label for pt in p.points] == ["budget=8 topk=4", "budget=8 topk=8", "budget=16 topk=4",
                                             "budget=16 topk=8", "budget=32 topk=4", "budget=32 topk=8",
                                             "budget=64 topk=1"]
    pt = p.points[2]
    assert p.command_for(pt, "/r/x y") == ["bench", "--budget", "16", "--topk", "4", "--out", "/r/x y",
                                           "--lit", "{x}", "--env", "${HOME}", "$USER"]
    assert p.dropin_for(pt, "/o") == "[Service]\nEnvironment=SPEC_BUDGET=16 SPEC_TOPK=4 OTHER=${KEEP} $$ {}\n"
    assert p.attempts == 2 and p.timeout is None and p.target is None


@pytest.mark.parametrize(("text", "key", "says"), [
    ('command = "x"\nbogus = 1\n[matrix]\na = [1]', "bogus", "unknown key"),
    ('[matrix]\na = [1]', "command", "required"),
    ('command = "x {b}"\n[matrix]\na = [1]', "command", "a value for {b}"),
    ('command = "x"\ndropin = "[Service]\\nA={nope}"\n[matrix]\na = [1]', "dropin", "a value for {nope}"),
    ('command = "x"\n[matrix]', "matrix", "a table"),
    ('command = "x"\n[matrix]\na = []', "matrix.a", "non-empty array"),
    ('command = "x"', "matrix", "at least one point"),
    ('command = "x {a"\n[matrix]\na = [1]', "command", "placeholder"),
    ('command = "x }"\n[matrix]\na = [1]', "command", "}}"),
    ('command = "x \'unclosed"\n[matrix]\na = [1]', "command", "balanced quotes"),
    ('command = "x"\ndropin = "Environment=A=1"\n[matrix]\na = [1]', "dropin", "section"),
    ('command = "x"\nattempts = 0\n[matrix]\na = [1]', "attempts", "integer >= 1"),
    ('command = "x"\ntimeout = -1\n[matrix]\na = [1]', "timeout", "> 0"),
    ('command = "x"\n[matrix]\nout = [1]', "matrix.out", "not 'out'"),
    ('command = "x"\n[matrix]\na = [1, 1]', "points", "every point once"),
    ('command = "x"\n[matrix]\na = ["two\\nlines"]', "matrix.a[0]", "one line"),
    ('command = "x"\n[matrix]\na = [1, 1e309]', "matrix.a[1]", "a finite number, found inf"),
    ('command = "x"\n[matrix]\na = [nan]', "matrix.a[0]", "a finite number, found nan"),
    ('command = "x"\n[[points]]\na = -inf', "points[0].a", "a finite number, found -inf"),
    ('command = "x"\nstray_wait = -1', "stray_wait", "a number of seconds >= 0, found integer -1"),
    # A value ending in a backslash would join the drop-in's next line to its own.
    ('command = "x"\ndropin = "[Service]\\nEnvironment=A={a}\\nExecStartPre=/bin/true"\n[matrix]\n'
     "b = [1, 2]\na = ['ok', 'bad\\']", "matrix.a[1]", r"'bad\\' in point 2 (b=1 a=bad\)"),
    ("command = 'x'\ndropin = \"[Service]\\nEnvironment=A={a}\"\n[[points]]\na = 'x'\n[[points]]\na = 'y\\ '",
     "points[1].a", "does not end in \\"),
])
def test_plan_errors_name_file_key_expected_found(text: str, key: str, says: str) -> None:
    with pytest.raises(ConfigError) as e:
        plan(text)
    assert e.value.file == "plan.toml" and e.value.key == key, str(e.value)
    assert says in str(e.value)


def test_values_reach_systemd_as_written_percent_doubled_in_the_dropin_only() -> None:
    """systemd reads `%h` as the home directory and drops a whole line over an unknown `%Z`: a value's
    `%` is doubled in the drop-in (the template's own specifiers stay), never in the command."""
    p = plan(r'''
command = "bench {v} {out}"
dropin = "[Service]\nEnvironment=\"V={v}\" UNIT=%n\nExecStartPre=/bin/echo {out}\n"
[matrix]
v = ["%Z", "a%20b", "%h"]
''')
    assert [p.dropin_for(pt, "/r/50%") for pt in p.points] == [
        f"[Service]\nEnvironment=\"V={v}\" UNIT=%n\nExecStartPre=/bin/echo /r/50%%\n" for v in ("%%Z", "a%%20b", "%%h")]
    assert p.command_for(p.points[1], "/r/50%") == ["bench", "a%20b", "/r/50%"]
    # Only in the drop-in: a trailing backslash in a command word is the command's business.
    assert plan("command = 'x {a}'\n[matrix]\na = ['c:\\']").points[0].as_dict() == {"a": "c:\\"}


def test_a_plan_of_too_many_points_is_refused_by_its_count_before_building_it() -> None:
    axes = "".join(f"a{i} = [0, 1]\n" for i in range(20))
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as e:
        plan(f'command = "x"\n[matrix]\n{axes}')
    assert time.monotonic() - t0 < 5  # a million points would take half a minute and 700 MB
    assert (e.value.key, e.value.found) == ("matrix", "1,048,576 (1,048,576 from [matrix])"), str(e.value)
    assert f"at most {sweepplan.MAX_POINTS:,} points" in str(e.value)
    many = "".join(f"[[points]]\nn = {i}\n" for i in range(sweepplan.MAX_POINTS - 1))
    with pytest.raises(ConfigError, match=r"points: expected at most 10,000 points, found 10,001 "
                                          r"\(2 from \[matrix\] \+ 9,999 \[\[points\]\]\)"):
        plan(f'command = "x"\n[matrix]\nb = [1, 2]\n{many}')
    assert len(plan(f'command = "x"\n[matrix]\nb = [1]\n{many}').points) == sweepplan.MAX_POINTS


def test_a_plan_that_is_not_a_regular_file_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "plan.fifo"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="expected a regular file"):
        sweepplan.load_plan(fifo)  # a plain open() would wait for a writer, for ever
    with pytest.raises(ConfigError, match="expected a regular file"):
        sweepplan.load_plan(tmp_path)


def test_dry_run_shows_line_breaks_systemd_does_not_make_escaped(tmp_path: Path) -> None:
    """systemd breaks lines at \\n only: U+2028 and U+0085 are part of the value, so the dry run, which
    shows one line per line systemd reads, shows them escaped."""
    p = plan('command = "bench {v}"\ndropin = "[Service]\\nEnvironment=V={v}\\n"\n'
             '[matrix]\nv = ["a\\u2028b", "c\\u0085d"]')
    out = io.StringIO()
    assert sweep.dry_run(p, tmp_path / "r", "u.service", "user", set(), out) == 0
    text = out.getvalue()
    assert "\u2028" not in text and "\x85" not in text
    assert "[1/2] v=a\\u2028b  (restart)\n" in text and "[2/2] v=c\\x85d  (restart)\n" in text
    assert "    Environment=V=a\\u2028b\n" in text and "  command: bench 'c\\x85d'\n" in text
    assert p.dropin_for(p.points[0], "/o") == "[Service]\nEnvironment=V=a\u2028b\n"  # written as it is


@pytest.mark.system
def test_a_bad_plan_exits_78_naming_the_key(tmp_path: Path) -> None:
    (tmp_path / "plan.toml").write_text('command = "x {b}"\n[matrix]\na = [1]\n')
    (tmp_path / "g.toml").write_text('[targets.t]\nunit = "x.service"\nurl = "http://127.0.0.1:1"\n')
    p = subprocess.run([*GENREADY, "sweep", str(tmp_path / "plan.toml"), "--results", str(tmp_path / "r"),
                        "--config", str(tmp_path / "g.toml")], capture_output=True, text=True, timeout=30)
    assert p.returncode == 78, p.stderr
    assert f"{tmp_path / 'plan.toml'}: command: expected a value for {{b}} in every point" in p.stderr


def test_points_with_the_same_dropin_form_one_group_even_when_the_file_alternates() -> None:
    p = plan('''
command = "bench -c {c} --budget {budget}"
dropin = "[Service]\\nEnvironment=BUDGET={budget}\\n"
[[points]]
budget = 8
c = 1
[[points]]
budget = 16
c = 1
[[points]]
budget = 8
c = 4
[[points]]
budget = 16
c = 4
[[points]]
budget = 8
c = 16
''')
    assert [[pt.index for pt in g] for g in p.groups()] == [[1, 3, 5], [2, 4]]
    assert sweeplines.loads_line(5, p.groups(), False) == "5 points, 2 server configurations: 2 loads"
    assert sweeplines.loads_line(5, p.groups(), True) == "5 points, 2 server configurations: 5 loads (--restart-each)"


def test_a_dropin_with_out_or_none_at_all() -> None:
    with_out = plan('command = "x"\ndropin = "[Service]\\nEnvironment=O={out}"\n[matrix]\na = [1, 2]')
    assert [[pt.index for pt in g] for g in with_out.groups()] == [[1], [2]]  # every point its own folder
    without = plan('command = "x {a}"\n[matrix]\na = [1, 2, 3]')
    assert [[pt.index for pt in g] for g in without.groups()] == [[1, 2, 3]]  # the unit's own configuration


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_shards_cover_every_point_exactly_once_and_keep_groups_whole(n: int) -> None:
    p = plan('command = "x {c}"\ndropin = "[Service]\\nEnvironment=A={a}"\n[matrix]\na = [1, 2, 3, 4]\nc = [1, 2, 3]')
    groups = p.groups()
    shards = [sweepplan.Shard.parse(f"{k}/{n}").take(groups) for k in range(1, n + 1)]
    assert sorted(pt.index for gs in shards for g in gs for pt in g) == [pt.index for pt in p.points]
    assert all(g in groups for gs in shards for g in gs)  # whole groups: each load happens on one host only


@pytest.mark.parametrize("bad", ["0/2", "3/2", "x/y", "1", "1/0", "-1/2", ""])
def test_a_bad_shard_is_refused_naming_the_flag(bad: str) -> None:
    with pytest.raises(ValueError, match="--shard: expected K/N with 1 <= K <= N"):
        sweepplan.Shard.parse(bad)


def _plan_and_config(tmp_path: Path) -> list[str]:
    (tmp_path / "plan.toml").write_text('command = "x {c}"\ndropin = "[Service]\\nEnvironment=A={a}\\n"\n'
                                        '[matrix]\na = [1, 2]\nc = [1, 2, 3, 4]\n')
    (tmp_path / "g.toml").write_text('[targets.t]\nunit = "x.service"\nurl = "http://127.0.0.1:1"\n')
    return [*GENREADY, "sweep", str(tmp_path / "plan.toml"), "--results", str(tmp_path / "r"), "--config",
            str(tmp_path / "g.toml"), "--dry-run"]


@pytest.mark.parametrize("bad", ["0/2", "x/y"])
@pytest.mark.system
def test_a_bad_shard_exits_64(tmp_path: Path, bad: str) -> None:
    p = subprocess.run([*_plan_and_config(tmp_path), "--shard", bad], capture_output=True, text=True, timeout=30)
    assert p.returncode == 64 and f"--shard: expected K/N with 1 <= K <= N (e.g. 1/4), found '{bad}'" in p.stderr


@pytest.mark.system
def test_dry_run_says_points_configurations_and_loads(tmp_path: Path) -> None:
    args = _plan_and_config(tmp_path)
    out = subprocess.run(args, capture_output=True, text=True, timeout=30, check=True).stdout
    assert out.startswith("# 8 points, 2 server configurations: 2 loads;"), out
    assert "## server configuration 2: points 5, 6, 7, 8" in out
    out = subprocess.run([*args, "--restart-each"], capture_output=True, text=True, timeout=30, check=True).stdout
    assert out.startswith("# 8 points, 2 server configurations: 8 loads (--restart-each);"), out
    out = subprocess.run([*args, "--shard", "2/2"], capture_output=True, text=True, timeout=30, check=True).stdout
    assert out.startswith("# 4 points, 1 server configuration: 1 load (shard 2/2: 4 of the plan's 8 points)"), out
    assert "[1/8]" not in out and "[5/8]" in out


def test_a_dropin_names_its_sweep_and_is_a_leftover_only_once_that_sweep_is_gone(tmp_path: Path) -> None:
    dropin = tmp_path / sweepdropin.DROPIN_NAME
    dropin.write_text(sweepdropin.owner_header("plan.toml", tmp_path / "r", "2026-01-01T00:00:00Z") + "[Service]\n")
    me = sweepdropin.owner_of(dropin.read_text())
    assert me is not None and me["pid"] == os.getpid() and me["results"] == str(tmp_path / "r")
    paths = ["/etc/x.service.d/10-a.conf", str(dropin)]
    assert sweepdropin.names_a_sweep_dropin(paths) and sweepdropin.leftover(paths) is None  # this process lives
    reused = dict(me, pid_start=me["pid_start"] + 1)  # the same PID, another process: not that sweep
    assert not sweepdropin.owner_alive(reused)
    dead = dict(me, pid=2**22 + 1, pid_start=None)  # above the kernel's PID_MAX_LIMIT: no such process
    assert not sweepdropin.owner_alive(dead)
    dropin.write_text(sweepdropin.OWNER_TAG + json.dumps(dead) + "\n[Service]\n")
    left = sweepdropin.leftover(paths)
    assert left is not None and left.path == str(dropin)
    assert left.warning("sim.service", "sim") == (
        f"sim.service runs the configuration of an interrupted sweep ({dropin}, plan {me['plan']}, sweep pid "
        f"{dead['pid']} gone); restore it with: genready sweep restore sim")
    dropin.write_text("# written by genready sweep plan.toml; removed when the sweep ends\n[Service]\n")
    assert "its sweep unnamed" in sweepdropin.leftover(paths).warning("u", "t")  # type: ignore[union-attr]
    assert sweepdropin.leftover(["/etc/x.service.d/10-a.conf"]) is None


@pytest.mark.parametrize("restart_each", [False, True])
def test_the_eta_counts_the_loads_left_and_the_runs_left(tmp_path: Path, restart_each: bool) -> None:
    p = plan('command = "x {c}"\ndropin = "[Service]\\nEnvironment=A={a}"\n[matrix]\na = [1, 2]\nc = [1, 2, 3]')
    s = runner.Sweep(steps.SweepOptions(p, "http://127.0.0.1:1", "t", "u.service", "user", 1, tmp_path,
                                       restart_each=restart_each), err=io.StringIO())
    s.plan_schedule(set())
    assert s.eta(p.points[0], loading=True) == ""  # nothing known yet
    s.timings.expected_load = 300.0  # the daemon's expected_load_seconds: before this sweep timed a load
    loads = 6 if restart_each else 2
    took = "30m00s" if restart_each else "10m00s"
    assert s.eta(p.points[0], loading=True) == f", ETA > {took} ({loads} loads, runs not yet timed)"
    s.timings.load_times, s.timings.run_times = [360.0], [60.0]  # measured: they win
    # At point 2 (reused, unless --restart-each): loads left are group 2's, plus this one's with --restart-each.
    want = "35m00s" if restart_each else "11m00s"  # 5 x 360 + 5 x 60, or 1 x 360 + 5 x 60
    assert s.eta(p.points[1], loading=restart_each) == f", ETA {want}"


@pytest.mark.parametrize("restart_each", [False, True])
def test_the_eta_counts_every_repeat(tmp_path: Path, restart_each: bool) -> None:
    p = plan('command = "x {c}"\ndropin = "[Service]\\nEnvironment=A={a}"\nrepeats = 3\n'
             '[matrix]\na = [1, 2]\nc = [1, 2, 3]')
    s = runner.Sweep(steps.SweepOptions(p, "http://127.0.0.1:1", "t", "u.service", "user", 1, tmp_path,
                                       restart_each=restart_each), err=io.StringIO())
    s.plan_schedule(set())
    s.timings.load_times, s.timings.run_times = [360.0], [60.0]
    # At point 2 (of 6), 5 points of 3 runs each are left: 15 runs; a load for group 2's first run only,
    # or, with a fresh start per run, one for each of the 15 (the current run's included while loading).
    want = "1h45m" if restart_each else "21m00s"  # 15 x 360 + 15 x 60, or 1 x 360 + 15 x 60
    assert s.eta(p.points[1], loading=restart_each) == f", ETA {want}"
    if restart_each:  # loaded already: that load is not left
        assert s.eta(p.points[1], loading=False) == ", ETA 1h39m"  # 14 x 360 + 15 x 60


def test_a_line_is_reused_only_by_the_configuration_that_made_it(tmp_path: Path) -> None:
    """Issue 41 #1 in-process: the fingerprint names what changed, `ok_runs` skips what another made."""
    a = plan('command = "bench --n {n} --out {out}"\ndropin = "[Service]\\nEnvironment=M={m}"\n'
             '[[points]]\nn = 1\nm = "x"\n[[points]]\nn = 2\nm = "y"')
    b = plan('command = "bench --n {n} --max-tokens 512 --out {out}"\ndropin = "[Service]\\nEnvironment=M={m}"\n'
             'warmup = 0\n[[points]]\nn = 1\nm = "x"\n[[points]]\nn = 2\nm = "y"')
    fa = {p.index: sweepresults.fingerprint(a, p, "t", "u.service", restart_each=False) for p in a.points}
    fb = {p.index: sweepresults.fingerprint(b, p, "t", "u.service", restart_each=False) for p in b.points}
    # issue 38: a's warmup is "stable" (the default), with its rule
    assert sweepresults.differing(fa[1], fb[1]) == ["command", "warmup", "warmup_rule"]
    assert sweepresults.differing(fa[1], {**fa[1], "unit": "v.service"}) == ["unit"]
    assert sweepresults.differing(None, fa[1]) == ["fingerprint"]  # a line from before fingerprints
    # {out} is each attempt's folder: the same configuration in another results folder is the same
    assert fa[1] == sweepresults.fingerprint(a, a.points[0], "t", "u.service", restart_each=False)
    log = sweepresults.ResultsLog(tmp_path)
    for p in a.points:
        log.append({"point": p.as_dict(), "status": "ok", "repeat": 1, "fingerprint": fa[p.index]})
    log.close()
    assert set(sweepresults.ok_runs(a, tmp_path, fa)) == {1, 2}
    assert sweepresults.ok_runs(b, tmp_path, fb) == {}
    assert sweepresults.changed_points(b, tmp_path, fb) == {1: ["command", "warmup", "warmup_rule"],
                                                            2: ["command", "warmup", "warmup_rule"]}
    assert sweepresults.changed_points(a, tmp_path, fa) == {}


def test_expect_is_in_the_fingerprint_so_resume_does_not_pass_it_unchecked(tmp_path: Path) -> None:
    """Issue 53 #7: lines made before the plan had `expect` were "already ok" on --resume, never checked."""
    text = 'command = "bench --n {n} --out {out}"\n[[points]]\nn = 1\n[[points]]\nn = 2\n'
    a, b = plan(text), plan(text + '[expect]\nspeculative_num_steps = "{n}"\n')
    fa = {p.index: sweepresults.fingerprint(a, p, "t", "u.service", restart_each=False) for p in a.points}
    fb = {p.index: sweepresults.fingerprint(b, p, "t", "u.service", restart_each=False) for p in b.points}
    assert "expect" not in fa[1]  # a plan without expect keeps the fingerprint it had (its old lines resume)
    assert fb[2]["expect"] == {"speculative_num_steps": "2"}  # per point, as confirm checks it
    log = sweepresults.ResultsLog(tmp_path)
    for p in a.points:
        log.append({"point": p.as_dict(), "status": "ok", "repeat": 1, "fingerprint": fa[p.index]})
    log.close()
    assert sweepresults.ok_runs(b, tmp_path, fb) == {}
    assert sweepresults.changed_points(b, tmp_path, fb) == {1: ["expect"], 2: ["expect"]}


def test_results_lines_are_strict_json(tmp_path: Path) -> None:
    """Issue 41 #7 for the sweep's writer: a non-finite figure is null, never a bare NaN or Infinity token."""
    log = sweepresults.ResultsLog(tmp_path)
    log.append({"point": {"a": 1}, "status": "ok", "prefix_cache_hit_rate": float("nan"),
                "metrics_accept_length": float("inf"), "deep": [{"x": -float("inf")}]})
    log.close()

    def refuse(token: str) -> None:
        raise ValueError(token)

    rec = json.loads((tmp_path / "results.jsonl").read_text(), parse_constant=refuse)
    assert rec["prefix_cache_hit_rate"] is None and rec["metrics_accept_length"] is None
    assert rec["deep"] == [{"x": None}]


def test_a_merged_report_with_a_shard_missing_says_so_and_marks_no_best(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 41 #4: shard 2/2 never ran; the report of shard 1/2 alone once exited 0 with half the points,
    its best marks computed over that half, and no word of what was missing."""
    def shard(folder: Path, k: int, points: list[int], ttft: list[float]) -> Path:
        folder.mkdir()
        with (folder / "results.jsonl").open("w") as f:
            for i, t in zip(points, ttft, strict=True):
                out = folder / f"p{i}"
                out.mkdir()
                bench = {"ttft_p50_ms": t, "output_tokens_per_s": 100.0 / t}
                (out / "bench.jsonl").write_text(json.dumps(bench) + "\n")
                f.write(json.dumps({"point": {"a": i}, "status": "ok", "index": i, "attempt": 1, "out": f"p{i}",
                                    "plan_points": 4, "shard": f"{k}/2"}) + "\n")
        return folder

    one = shard(tmp_path / "shard-1", 1, [1, 3], [50.0, 40.0])
    assert report_main([str(one)], "table") == 0
    out, err = capsys.readouterr()
    assert "2 of 4 points have no result (shard 2/2 missing or unfinished)" in err, err
    assert "(partial: 2 of 4 points have no result" in out and "*" not in out, out
    assert report_main([str(one)], "table", strict=True) == 1
    two = shard(tmp_path / "shard-2", 2, [2, 4], [60.0, 70.0])
    capsys.readouterr()
    assert report_main([str(one), str(two)], "table", strict=True) == 0
    out, err = capsys.readouterr()
    assert "partial" not in out + err and "*" in out, out


# --- an attempt without a verified instance runs nothing (issue 41 #0) -----------------------------------


class ScriptedDaemon(JsonServer):
    """genready's /ready/t on loopback answering from a script, (code, body) in turn, the last for ever.
    Stands in for the daemon where its answer is the point: a start it never verifies, a target it no
    longer has (the Rig tests below run the real one)."""

    def __init__(self, answers: list[tuple[int, dict[str, Any]]]) -> None:
        self.answers = answers
        super().__init__(lambda path: in_turn(self, self.answers))


class LoadingUnit:
    """The sweep's systemd client for a unit whose restarted process (pid 6521) is still loading: its restart
    writes the process's first line to the unit's output file, where the sweep reads a failed start's lines.
    A stand-in: the daemon's answer, not systemd's, is what these tests vary."""

    def __init__(self, tmp: Path, on_restart: Any = None) -> None:
        self.unit, self.restarts, self.on_restart = "t.service", 0, on_restart
        self.log = tmp / "unit.log"
        self.log.write_text("an earlier start's line\n")
        self.fragment = tmp / "t.service"
        self.fragment.write_text(f"[Service]\nExecStart=/bin/true\nStandardError=append:{self.log}\n")

    def state(self) -> Any:
        from genready.systemd.snapshot import Snapshot

        return Snapshot("t.service", load_state="loaded", main_pid=6521 if self.restarts else 6491,
                        invocation_id="ef" * 16, fragment_path=str(self.fragment))

    def restart(self, unit: str | None = None, *, reset_failed: bool = True) -> None:
        self.restarts += 1
        with self.log.open("a") as f:
            f.write("loading weights 37%\n")
        if self.on_restart:
            self.on_restart()

    def write_dropin(self, unit: str, name: str, text: str, *, written: Any) -> None:
        written(Path(name))


LOADING: Final[tuple[int, dict[str, Any]]] = (
    503, {"ready": False, "target": "t", "state": "loading", "pid": 6521, "reason": "loading"})
EARLIER: Final = {"ready": True, "target": "t", "unit": "t.service", "pid": 6491, "invocation_id": "ab" * 16,
                  "ready_since": "2026-01-01T00:00:00Z", "load_seconds": 1.0}


@pytest.mark.parametrize("earlier", [False, True], ids=["first-point", "after-a-verified-point"])
@pytest.mark.parametrize("case", ["timeout", "failed", "vanished", "interrupted"])
def test_an_attempt_without_a_verified_start_runs_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           case: str, earlier: bool) -> None:
    """A load slower than the timeout once ran the command against the previous point's instance (or raised
    KeyError on a first point), its live line saying "ready". Every way to an attempt without a verified
    start: timed out, failed, the target gone from the daemon, the wait interrupted."""
    marker = tmp_path / "ran"
    p = plan(tomli_w.dumps({"command": [PY, "-c", f"open({str(marker)!r}, 'w')"], "attempts": 1,
                            "dropin": "[Service]\nEnvironment=A={a}\n", "matrix": {"a": [1]}}))
    failed = {"ready": False, "target": "t", "state": "inactive", "reason": "t.service is failed",
              "start_failed": {"invocation_id": "cd" * 16, "main_pid": 6521, "result": "exit-code",
                               "exit_code": "exited", "exit_status": 3, "ended_at": "x",
                               "journal": ["no such model"], "restarting": False}}
    scripts: dict[str, list[tuple[int, dict[str, Any]]]] = {
        "timeout": [LOADING], "failed": [LOADING, (503, failed)], "interrupted": [LOADING],
        "vanished": [(404, {"error": "no target 't'"})]}
    script = scripts[case]
    # after a verified point: its instance is checked first (guard.check) and found gone
    d = ScriptedDaemon([LOADING, *script] if earlier else script)
    err = io.StringIO()
    s = runner.Sweep(steps.SweepOptions(p, d.base, "t", "t.service", "user", 0.6, tmp_path / "r"), err=err)
    unit = LoadingUnit(tmp_path, on_restart=(lambda: setattr(s.signals, "count", 1)) if case == "interrupted" else None)
    ctx = steps.Ctx(s.opts, s.console, DropinLife(unit, tmp_path / "d.conf"),  # type: ignore[arg-type]
                    s.timings, s.signals, None, 0.0)
    monkeypatch.setattr(steps, "POLL", 0.05)
    instance = steps.Verified.of(EARLIER, restarted=True, started_at=0.0) if earlier else None
    try:
        if case == "interrupted":
            with pytest.raises(runner.Stopped) as e:
                s._attempt(ctx, p.points[0], 1, 1, instance)
            att, kept, stop = e.value.attempt, None, ""
        else:
            att, kept, stop = s._attempt(ctx, p.points[0], 1, 1, instance)
    finally:
        d.close()
    said = err.getvalue()
    assert not marker.exists() and "ready pid" not in said and "running" not in said, said
    assert unit.restarts == 1 and kept is None and att.pid is None and att.ran_at is None, att
    rec = att.to_json("t", "t.service")
    json.dumps(rec, allow_nan=False)
    if case == "timeout":
        assert att.status is sweepresults.Status.NOT_READY and att.waited_seconds is not None, att
        assert att.waited_seconds >= 0.6 and rec["waited_seconds"] >= 0.6
        assert att.reason.startswith("no verified start within 0.6s (pid 6521 still loading after"), att.reason
        assert rec["journal"] == ["loading weights 37%"] and att.unit_result == ""
    elif case == "failed":
        assert att.status is sweepresults.Status.NOT_READY and "failed to start" in att.reason
        assert rec["journal"] == ["no such model"]
    elif case == "vanished":
        assert att.status is sweepresults.Status.NOT_READY and "no target 't'" in stop
    else:
        assert att.status is sweepresults.Status.INVALIDATED and att.reason == "the sweep was interrupted"


def test_the_live_line_never_says_ready_for_the_previous_instance(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Right after a restart the daemon may still answer /ready?since= with the instance before (503,
    state ready): the line says it waits for the restarted one."""
    p = plan('command = "x"\n[matrix]\na = [1]')
    before = (503, {**EARLIER, "ready": False, "state": "ready", "reason": "ready, but started before since"})
    d = ScriptedDaemon([before])
    err = io.StringIO()
    s = runner.Sweep(steps.SweepOptions(p, d.base, "t", "t.service", "user", 0.3, tmp_path / "r"), err=err)
    ctx = steps.Ctx(s.opts, s.console, DropinLife(LoadingUnit(tmp_path), tmp_path / "d.conf"),  # type: ignore[arg-type]
                    s.timings, s.signals, None, 0.0)
    monkeypatch.setattr(steps, "POLL", 0.05)
    try:
        got = steps.start(ctx, p.points[0])
    finally:
        d.close()
    assert isinstance(got, steps.NotReady)
    assert "waiting for the restarted instance (pid 6491 is the one before)" in err.getvalue()
    assert "ready " not in err.getvalue().replace("ready, but", ""), err.getvalue()


# --- whole sweeps against the private manager -----------------------------------------------------

# The command of every point: records what it saw; optional behaviours by flag.
SCRIPT = r'''
import json, os, signal, subprocess, sys, time, urllib.request
url, out, log, mode, marker = sys.argv[1:6]
pid = int(os.environ["GENREADY_PID"])
models = json.load(urllib.request.urlopen(url + "/v1/models", timeout=5))
seen = {"model": models["data"][0]["id"], "pid": pid, "invocation_id": os.environ["GENREADY_INVOCATION_ID"],
        "cmdline": open(f"/proc/{pid}/cmdline").read().split("\0"),
        "point": json.loads(os.environ["GENREADY_SWEEP_POINT"]), "out": os.environ["GENREADY_SWEEP_OUT"]}
with open(os.path.join(out, "seen.json"), "w") as f:
    json.dump(seen, f)
print("measured", seen["model"])
if mode == "restart-once" and not os.path.exists(marker):
    open(marker, "w").close()
    subprocess.run(["systemctl", "--user", "restart", "--no-block", os.environ["GENREADY_UNIT"]], check=True)
if mode.startswith(("block-at-", "stubborn-at-")) and seen["point"]["n"] == int(mode.split("-")[-1]) \
        and not os.path.exists(marker):
    if mode.startswith("stubborn"):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    with open(marker, "w") as f:
        f.write(str(os.getpid()))
    while True:
        time.sleep(0.02)
if mode == "fill":  # the results folder's disk fills up during the run
    try:
        with open(os.path.join(out, "filler"), "wb", buffering=0) as f:
            while True:
                f.write(b"\0" * 4096)
    except OSError:
        pass
with open(log, "a") as f:
    f.write(json.dumps(seen["point"]) + "\n")
'''


class Rig:
    """A simulator unit whose flags come from $SIM_FLAGS, a genready watching it, and a plan writer."""

    def __init__(self, manager: UserManager, tmp: Path, target: dict[str, Any] | None = None) -> None:
        self.manager, self.tmp = manager, tmp
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.sim_log = tmp / "sim.log"
        # $SIM_FLAGS (not ${…}) is split into words by systemd; empty means no extra flags.
        manager.install_unit(UNIT, f"""[Unit]
StartLimitIntervalSec=0
[Service]
Environment=SIM_FLAGS=
ExecStart={PY} -m genready.cli simulate --port {self.port} --load-seconds 0.2 $SIM_FLAGS
TimeoutStopSec=10
StandardError=append:{self.sim_log}
""")
        manager.systemctl("start", UNIT)
        self.g = Genready(manager, tmp, {"t": {"unit": UNIT, "url": self.url, **FAST, **(target or {})}}).start()
        wait_for(lambda: self.g.get("/ready/t")[0] == 200, 20, "the first start verified")
        self.script = tmp / "cmd.py"
        self.script.write_text(SCRIPT)
        self.ran = tmp / "ran.log"
        self.results = tmp / "results"

    def write_plan(self, matrix: dict[str, list[Any]] | None = None, *, points: list[dict[str, Any]] | None = None,
                   flags: str = "--model m-{budget}-{topk}", mode: str = "plain", **extra: Any) -> Path:
        doc: dict[str, Any] = {
            "target": "t", "timeout": 20,
            "command": [PY, str(self.script), self.url, "{out}", str(self.ran), mode, str(self.tmp / "marker")],
            "dropin": f'[Service]\nEnvironment="SIM_FLAGS={flags}"\n', **extra}
        if matrix:
            doc["matrix"] = matrix
        if points:
            doc["points"] = points
        path = self.tmp / "plan.toml"
        path.write_text(tomli_w.dumps(doc))
        return path

    def sweep(self, plan: Path, *args: str, wrap: Sequence[str] = (), env: dict[str, str] | None = None,
              stderr: Any = None) -> subprocess.Popen[str]:
        self.err = self.tmp / f"sweep-{time.monotonic_ns()}.err"
        return subprocess.Popen([*wrap, *GENREADY, "sweep", str(plan), "--results", str(self.results), "--config",
                                 str(self.g.config_path), *args], env={**self.manager.env, **(env or {})},
                                text=True, stdout=subprocess.PIPE, stderr=stderr or self.err.open("w"))

    def run(self, plan: Path, *args: str, wrap: Sequence[str] = (), env: dict[str, str] | None = None
            ) -> tuple[int, str]:
        p = self.sweep(plan, *args, wrap=wrap, env=env)
        out, _ = p.communicate(timeout=120)
        print(out, self.err.read_text())
        return p.returncode, out

    def results_lines(self) -> list[dict[str, Any]]:
        path = self.results / "results.jsonl"
        return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []

    def assert_restored(self) -> None:
        """No drop-in of ours left, and the unit's verified start runs the unit's own command line."""
        dropins = self.manager.show(UNIT, "DropInPaths")["DropInPaths"]
        assert sweepdropin.DROPIN_NAME not in dropins, dropins
        runtime = Path(self.manager.env["XDG_RUNTIME_DIR"]) / "systemd" / "user" / f"{UNIT}.d"
        assert not runtime.exists() or not any(runtime.iterdir())
        code, body = self.g.get("/ready/t")
        assert code == 200 and body["pid"] == show(self.manager, UNIT)[0], body
        assert "--model" not in Path(f"/proc/{body['pid']}/cmdline").read_text()

    def close(self) -> None:
        self.g.stop()
        self.manager.systemctl("stop", UNIT, check=False)
        self.manager.systemctl("reset-failed", UNIT, check=False)
        self.manager.remove_unit(UNIT)


def test_matrix_sweep_runs_each_point_on_its_own_verified_start(rig: Rig) -> None:
    plan = rig.write_plan({"budget": [8, 16, 32], "topk": [4, 8]})
    rc, out = rig.run(plan)
    assert rc == 0, out
    lines = rig.results_lines()
    assert [ln["point"] for ln in lines] == [{"budget": b, "topk": k} for b in (8, 16, 32) for k in (4, 8)]
    pids = set()
    for ln in lines:
        assert ln["status"] == "ok" and ln["attempt"] == 1 and ln["exit_code"] == 0, ln
        seen = json.loads((rig.results / ln["out"] / "seen.json").read_text())
        want = f"m-{ln['point']['budget']}-{ln['point']['topk']}"
        # The server answered with this point's settings, and the verified PID was started with them.
        assert seen["model"] == want and want in seen["cmdline"], seen
        assert seen["pid"] == ln["pid"] and seen["invocation_id"] == ln["invocation_id"], (seen, ln)
        assert seen["point"] == ln["point"] and seen["out"] == str(rig.results / ln["out"])
        # ... and genready recorded that PID's start as verified, after the point's restart.
        rec = next(r for r in rig.g.records("t") if r["invocation_id"] == ln["invocation_id"])
        assert rec["main_pid"] == ln["pid"] and rec["ready_at"] is not None
        assert rec["started_at"] >= ln["started_at"] and ln["load_seconds"] is not None
        assert (rig.results / ln["out"] / "stdout.log").read_text() == f"measured {want}\n"
        pids.add(ln["pid"])
    assert len(pids) == 6
    assert out.splitlines()[0].split() == ["POINT", "STATUS", "ATTEMPT", "PID", "LOAD", "s", "RUN", "s"]
    assert re.search(rf"^budget=32 topk=8\s+ok\s+1\s+{lines[-1]['pid']}\s+\d+\.\d\s+\d+\.\d$", out, re.M), out
    assert "6/6 points ok" in out
    rig.assert_restored()


def test_a_point_that_fails_to_start_is_not_ready_with_its_output_and_the_sweep_goes_on(rig: Rig) -> None:
    ok = "--load-seconds 0.2"
    plan = rig.write_plan(points=[{"budget": 8, "topk": 4, "extra": ok},
                                  {"budget": 99, "topk": 0, "extra": "--no-such-flag=oom"},
                                  {"budget": 16, "topk": 4, "extra": ok}],
                          flags="--model m-{budget}-{topk} {extra}")
    # The second point's server refuses its arguments and exits: the unit fails on every attempt.
    rc, out = rig.run(plan)
    assert rc == 1, out
    lines = rig.results_lines()
    assert [(ln["point"]["budget"], ln["status"], ln["attempt"]) for ln in lines] == [
        (8, "ok", 1), (99, "not_ready", 1), (99, "not_ready", 2), (16, "ok", 1)]
    bad = lines[1]
    assert "failed to start" in bad["reason"] and bad["unit_result"] != "success", bad
    assert any("unrecognized arguments: --no-such-flag=oom" in ln for ln in bad["journal"]), bad["journal"]
    assert not any("m-8-4" in ln for ln in bad["journal"])  # only that start's lines
    assert "not_ready" in out and "2/3 points ok" in out
    rig.assert_restored()


def test_a_restart_during_the_run_invalidates_it_and_the_retry_is_ok(rig: Rig) -> None:
    plan = rig.write_plan(points=[{"budget": 8, "topk": 4}], mode="restart-once")
    rc, out = rig.run(plan)
    assert rc == 0, out
    first, second = rig.results_lines()
    assert first["status"] == "invalidated" and "readiness" in first["reason"], first
    assert first["exit_code"] == 0  # the command itself succeeded: its numbers are still not kept
    assert second["status"] == "ok" and second["attempt"] == 2 and second["pid"] != first["pid"]
    assert first["out"] != second["out"]
    rig.assert_restored()


def test_sigint_mid_sweep_cleans_up_and_resume_runs_each_point_ok_once(rig: Rig) -> None:
    points = [{"n": i, "budget": 8, "topk": i} for i in (1, 2, 3)]
    plan = rig.write_plan(points=points, mode="block-at-2")
    p = rig.sweep(plan)
    wait_for(lambda: (rig.tmp / "marker").exists() or p.poll() is not None, 60, "point 2's command running")
    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 130, (out, rig.err.read_text())
    assert [(ln["point"]["n"], ln["status"]) for ln in rig.results_lines()] == [(1, "ok"), (2, "invalidated")]
    assert "interrupted" in rig.results_lines()[1]["reason"]
    rig.assert_restored()

    rc, out = rig.run(plan, "--resume")
    assert rc == 0, out
    lines = rig.results_lines()
    oks = [ln["point"]["n"] for ln in lines if ln["status"] == "ok"]
    assert sorted(oks) == [1, 2, 3], lines
    assert [json.loads(x)["n"] for x in rig.ran.read_text().splitlines()] == [1, 2, 3]  # 1 was not re-run
    assert "ok (earlier run)" in out
    rig.assert_restored()


def test_a_second_sigint_exits_at_once_naming_what_is_left(rig: Rig) -> None:
    plan = rig.write_plan(points=[{"n": 1, "budget": 8, "topk": 1}], mode="stubborn-at-1")
    p = rig.sweep(plan)
    wait_for(lambda: (rig.tmp / "marker").exists() or p.poll() is not None, 60, "the command running")
    p.send_signal(signal.SIGINT)  # the command ignores it: the sweep would wait STOP_GRACE for it
    wait_for(lambda: "again to exit at once" in rig.err.read_text(), 10, "the first SIGINT acknowledged")
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    p.communicate(timeout=10)
    err = rig.err.read_text()
    assert p.returncode == 130 and time.monotonic() - t0 < steps.STOP_GRACE, err
    dropin = Path(rig.manager.env["XDG_RUNTIME_DIR"]) / "systemd" / "user" / f"{UNIT}.d" / sweepdropin.DROPIN_NAME
    assert f"the drop-in {dropin} is still in place" in err and "was killed" in err, err
    assert dropin.exists()
    dropin.unlink()  # the cleanup the message asked for, so the next test finds the unit as it was
    rig.manager.systemctl("daemon-reload")


def test_dry_run_changes_nothing(rig: Rig) -> None:
    plan = rig.write_plan({"budget": [8, 16], "topk": [4]})
    before = show(rig.manager, UNIT)
    rc, out = rig.run(plan, "--dry-run")
    assert rc == 0
    assert "[2/2] budget=16 topk=4" in out and 'Environment="SIM_FLAGS=--model m-16-4"' in out
    assert show(rig.manager, UNIT) == before
    assert not rig.results.exists() and not rig.ran.exists()
    assert rig.manager.show(UNIT, "DropInPaths")["DropInPaths"] == ""


def test_one_load_per_server_configuration_in_group_order(rig: Rig) -> None:
    # The file alternates the server setting; the sweep runs budget 8's points, then budget 16's.
    plan = rig.write_plan(points=[{"n": 1, "budget": 8}, {"n": 2, "budget": 16}, {"n": 3, "budget": 8},
                                  {"n": 4, "budget": 16}], flags="--model m-{budget}")
    rc, out = rig.run(plan)
    assert rc == 0, out
    lines = rig.results_lines()
    assert [(ln["point"]["n"], ln["restarted"], ln["group"]) for ln in lines] == [
        (1, True, 1), (3, False, 1), (2, True, 2), (4, False, 2)]
    assert lines[0]["pid"] == lines[1]["pid"] and lines[2]["pid"] == lines[3]["pid"] != lines[0]["pid"]
    assert lines[1]["load_seconds"] == lines[0]["load_seconds"]  # the load of the instance that served it
    for ln in lines:
        seen = json.loads((rig.results / ln["out"] / "seen.json").read_text())
        assert seen["model"] == f"m-{ln['point']['budget']}" and seen["pid"] == ln["pid"], (seen, ln)
        assert ln["host"] and ln["index"] == ln["point"]["n"]
    assert "4/4 points ok, 2 loads" in out
    rig.assert_restored()


def test_restart_each_starts_every_point_fresh(rig: Rig) -> None:
    plan = rig.write_plan(points=[{"n": 1, "budget": 8}, {"n": 2, "budget": 8}], flags="--model m-{budget}")
    rc, out = rig.run(plan, "--restart-each")
    assert rc == 0, out
    lines = rig.results_lines()
    assert [ln["restarted"] for ln in lines] == [True, True] and lines[0]["pid"] != lines[1]["pid"]
    assert "2/2 points ok, 2 loads" in out
    rig.assert_restored()


def test_a_reused_instance_that_died_between_points_restarts(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in rig.manager.env.items():
        monkeypatch.setenv(k, v)
    reuse = steps.reuse

    def kill_then_reuse(ctx: steps.Ctx, point: sweepplan.Point, instance: steps.Verified, folder: Path
                        ) -> steps.Verified | None:
        """The group's instance killed (kill -9) before point 2, once the daemon has seen it go."""
        if point.index == 2:
            os.kill(instance.pid, signal.SIGKILL)
            wait_for(lambda: rig.g.get("/ready/t")[1].get("pid") != instance.pid, 20, "the daemon seeing it gone")
        return reuse(ctx, point, instance, folder)

    monkeypatch.setattr(steps, "reuse", kill_then_reuse)
    path = rig.write_plan(points=[{"n": 1, "budget": 8}, {"n": 2, "budget": 8}, {"n": 3, "budget": 8}],
                          flags="--model m-{budget}")
    out, err = io.StringIO(), io.StringIO()
    s = runner.Sweep(steps.SweepOptions(sweepplan.load_plan(path), rig.g.base, "t", UNIT, "user", 20, rig.results),
                     out=out, err=err)
    assert s.run(set()) == 0, err.getvalue()
    lines = rig.results_lines()
    assert [(ln["point"]["n"], ln["status"], ln["restarted"]) for ln in lines] == [
        (1, "ok", True), (2, "ok", True), (3, "ok", False)], err.getvalue()
    assert lines[0]["pid"] != lines[1]["pid"] == lines[2]["pid"]
    assert "no longer usable" in err.getvalue()
    rig.assert_restored()


def test_a_start_that_times_out_is_not_ready_and_runs_nothing_first_or_after_a_verified_point(rig: Rig) -> None:
    """Issue 41 #0 with the real daemon and manager: a load slower than the timeout, as the sweep's first point
    (once a KeyError traceback) and after a verified point (once its command ran against the previous
    point's instance, its line saying "ready pid ... loaded in Nones")."""
    slow = 120  # seconds the simulator "loads": far past the plan's timeout
    plan = rig.write_plan(points=[{"n": 1, "load": slow}, {"n": 2, "load": 0.2}, {"n": 3, "load": slow}],
                          flags="--model m-{n} --load-seconds {load}", timeout=4, attempts=1)
    rc, _ = rig.run(plan)
    err = rig.err.read_text()
    got = rig.results_lines()
    assert rc == 1 and [(ln["point"]["n"], ln["status"]) for ln in got] == [
        (1, "not_ready"), (2, "ok"), (3, "not_ready")], err
    ran = [json.loads(ln)["n"] for ln in rig.ran.read_text().splitlines()]
    assert ran == [2], ran  # the command ran on point 2's verified start only
    for ln in (got[0], got[2]):
        assert ln["pid"] is None and ln["waited_seconds"] >= 4 and "no verified start within 4s" in ln["reason"], ln
        assert "still loading after" in ln["reason"], ln
    assert err.count("ready pid") == 1 and "loaded in Nones" not in err, err
    rig.assert_restored()


def test_resume_of_an_edited_plan_stops_before_the_unit_naming_what_changed(rig: Rig) -> None:
    """Issue 41 #1: `--resume` once counted an ok line of the same point values as done, whatever drop-in or
    command made it: an edited plan reported the old figures as its own."""
    plan = rig.write_plan(points=[{"n": 1, "budget": 8}], flags="--model m-{budget}")
    assert rig.run(plan, "--resume")[0] == 0
    assert rig.run(plan, "--resume")[0] == 0  # the same plan: nothing to run again
    assert [ln["status"] for ln in rig.results_lines()] == ["ok"]
    pid = rig.g.get("/ready/t")[1]["pid"]
    plan = rig.write_plan(points=[{"n": 1, "budget": 8}], flags="--model other-{budget}")
    rc, _ = rig.run(plan, "--resume")
    err = rig.err.read_text()
    assert rc == 78 and "point 1: dropin differ" in err and "--resume=rerun-changed" in err, err
    assert rig.g.get("/ready/t")[1]["pid"] == pid  # the unit was not touched
    rc, _ = rig.run(plan, "--resume=rerun-changed")
    assert rc == 0, rig.err.read_text()
    got = rig.results_lines()
    assert [ln["status"] for ln in got] == ["ok", "ok"] and got[0]["fingerprint"] != got[1]["fingerprint"]
    assert json.loads(rig.ran.read_text().splitlines()[-1])["n"] == 1
    table = subprocess.run([*GENREADY, "sweep", "report", str(rig.results)], capture_output=True, text=True,
                           timeout=60, check=True).stdout
    assert table.count("n=1 budget=8 [fingerprint ") == 2, table  # two rows, each marked, never merged
    rig.assert_restored()


# --- what systemd would rewrite, drop or refuse ---------------------------------------------------------


def test_values_systemd_would_rewrite_reach_the_server_as_written(rig: Rig) -> None:
    """`%h` was the home directory, `%Z` and `%20` made systemd drop the whole Environment= line (the server
    ran its base configuration, recorded ok); a `%` in the results folder, pasted as {out}, likewise."""
    rig.results = rig.tmp / "res%h%Z"
    dropin = '[Service]\nEnvironment="SIM_FLAGS=--model m-{budget}-{topk}" "POINT_OUT={out}"\n'
    plan = rig.write_plan(points=[{"budget": b, "topk": 1} for b in ("a%20b", "%h", "%Z", "100%")], dropin=dropin)
    rc, out = rig.run(plan)
    assert rc == 0, out
    lines = rig.results_lines()
    assert [ln["status"] for ln in lines] == ["ok"] * 4, lines
    for ln in lines:
        seen = json.loads((rig.results / ln["out"] / "seen.json").read_text())
        assert seen["model"] == f"m-{ln['point']['budget']}-1", seen
        environ = Path(f"/proc/{seen['pid']}/environ").read_bytes() if Path(f"/proc/{seen['pid']}").exists() else b""
        assert not environ or f"POINT_OUT={rig.results / ln['out']}".encode() in environ.split(b"\0")
    rig.assert_restored()


@pytest.mark.parametrize(("dropin", "says"), [
    ("[Service]\nEnviroment=SIM_FLAGS=--model m-{budget}\n", "Unknown key 'Enviroment' in section [Service]"),
    ("[Service\nEnvironment=SIM_FLAGS=--model m-{budget}\n", "Invalid section header '[Service'"),
    ("[Servcie]\nEnvironment=SIM_FLAGS=--model m-{budget}\n", "Unknown section 'Servcie'"),
    ('[Service]\nEnvironment="SIM_FLAGS=--model m-{budget}\n', "Invalid syntax"),
])
def test_a_dropin_systemd_would_ignore_exits_78_before_anything_changes(rig: Rig, dropin: str, says: str) -> None:
    """systemd ignores such lines (logging them) and the server ran its base configuration, recorded ok.
    Every drop-in is checked with systemd-analyze verify first; if systemd would take none as written, the
    plan is wrong: exit 78 naming the point and systemd's words, the unit not touched."""
    plan = rig.write_plan(points=[{"budget": 8}, {"budget": 16}], dropin=dropin)
    before = show(rig.manager, UNIT)
    rc, out = rig.run(plan, "--dry-run")
    err = rig.err.read_text()
    assert rc == 78 and says in out and "systemd would not take this drop-in as written" in out, (out, err)
    assert f"{plan}: dropin: expected unit file text systemd takes as written" in err and "(and 1 more" in err
    rc, out = rig.run(plan)
    err = rig.err.read_text()
    assert rc == 78, (out, err)
    assert "for point 1 (budget=8)" in err and says in err and sweepdropin.DROPIN_NAME in err, err
    assert show(rig.manager, UNIT) == before and not rig.results.exists()
    assert rig.manager.show(UNIT, "DropInPaths")["DropInPaths"] == ""


def _three_points_the_second_refused(rig: Rig) -> Path:
    # An ExecStart= emptied by the second point's value: systemd refuses to start the unit at all.
    return rig.write_plan(points=[{"n": 1, "reset": "#"}, {"n": 2, "reset": "ExecStart="}, {"n": 3, "reset": "#"}],
                          dropin='[Service]\nEnvironment="SIM_FLAGS=--model m-{n}"\n{reset}\n')


def test_a_dropin_systemd_refuses_is_one_point_not_ready_in_its_words(rig: Rig) -> None:
    rc, out = rig.run(_three_points_the_second_refused(rig))
    err = rig.err.read_text()
    assert rc == 1, (out, err)
    assert "systemd would not take the drop-in of 1 of 3 server configurations" in err
    lines = rig.results_lines()
    assert [(ln["point"]["n"], ln["status"], ln["attempt"]) for ln in lines] == [
        (1, "ok", 1), (2, "not_ready", 1), (3, "ok", 1)], lines  # not retried: systemd would refuse again
    assert "Service has no ExecStart=" in lines[1]["reason"] and lines[1]["pid"] is None, lines[1]
    assert any("Service has no ExecStart=" in j for j in lines[1]["journal"])
    assert "DBus" not in err and "Traceback" not in err
    rig.assert_restored()


def test_without_systemd_analyze_a_restart_systemd_refuses_is_not_ready_in_its_words(rig: Rig) -> None:
    """No systemd-analyze on PATH: the sweep says it does not check, and systemd's own refusal of the
    restart (D-Bus) is the point's not_ready, not an abort with pystemd's DBusBaseError."""
    rc, out = rig.run(_three_points_the_second_refused(rig), env={"PATH": str(rig.tmp / "nothing")})
    err = rig.err.read_text()
    assert rc == 1, (out, err)
    assert "not checking the drop-ins with systemd-analyze verify: systemd-analyze is not installed" in err
    lines = rig.results_lines()
    assert [(ln["point"]["n"], ln["status"]) for ln in lines] == [(1, "ok"), (2, "not_ready"), (3, "ok")], lines
    assert lines[1]["reason"] == f"systemd refused to restart {UNIT}: Unit {UNIT} has a bad unit file setting."
    assert "i bet you" not in err and "Traceback" not in err
    rig.assert_restored()


def test_a_closed_output_pipe_does_not_stop_the_sweep_or_its_restore(rig: Rig) -> None:
    """`genready sweep ... 2>&1 | head -n 2`: the sweep died of EPIPE after point 1, with the drop-in removed
    and the unit never restarted: the server ran point 1's configuration while the unit said base."""
    plan = rig.write_plan(points=[{"budget": b, "topk": 1} for b in (8, 16, 32)])
    p = rig.sweep(plan, stderr=subprocess.STDOUT)
    assert p.stdout is not None
    got = [p.stdout.readline(), p.stdout.readline()]
    p.stdout.close()  # as head does after its lines
    assert p.wait(timeout=120) == 0, got
    assert [ln["status"] for ln in rig.results_lines()] == ["ok"] * 3
    rig.assert_restored()


@pytest.mark.system
def test_a_results_path_with_a_line_break_exits_64(tmp_path: Path) -> None:
    """Pasted as {out} into a drop-in, a line break started a new directive (an ExecStartPre= that ran)."""
    (tmp_path / "plan.toml").write_text('command = "x {out}"\ndropin = "[Service]\\nEnvironment=O={out}"\n'
                                        '[matrix]\na = [1]\n')
    (tmp_path / "g.toml").write_text('[targets.t]\nunit = "x.service"\nurl = "http://127.0.0.1:1"\n')
    bad = str(tmp_path / "r\nExecStartPre=-/bin/touch /tmp/pwned")
    p = subprocess.run([*GENREADY, "sweep", str(tmp_path / "plan.toml"), "--results", bad,
                        "--config", str(tmp_path / "g.toml")], capture_output=True, text=True, timeout=30)
    assert p.returncode == 64, p.stderr
    assert "--results: expected a path without control characters or line breaks, found \\n" in p.stderr
    assert not Path(bad).exists()


def test_systemd_refusals_are_told_in_systemds_words_and_only_denials_hint_at_root() -> None:
    """A restart systemd refuses (a drop-in it cannot load) is the point's doing, in systemd's words; only a
    denial (AccessDenied, polkit) is the sweep's, and the one that needs root."""
    from pystemd.dbusexc import DBusAccessDeniedError, DBusBaseError

    from genready.systemd import bus

    refused = DBusBaseError(8, b"org.freedesktop.systemd1.BadUnitSetting",
                            b"Unit x.service has a bad unit file setting.")
    assert "i bet you" in str(refused)  # what the sweep printed before
    assert bus.dbus_words(refused) == "Unit x.service has a bad unit file setting." and not bus.denied(refused)
    no = DBusAccessDeniedError(13, b"org.freedesktop.DBus.Error.AccessDenied", b"Access denied")
    assert bus.denied(no) and bus.dbus_words(no) == "Access denied"
    assert bus.dbus_words(OSError("plain")) == "plain"


def test_results_paths_with_control_characters_are_refused() -> None:
    for bad in ("r\nExecStartPre=/bin/x", "r\u2028x", "r\x85x", "r\tx", "r\x7fx"):
        why = sweep.check_results_path(Path(bad))
        assert why is not None and why.startswith("--results: expected a path without control characters"), bad
    assert sweep.check_results_path(Path("/srv/sweeps/100% é [a b]")) is None


def test_a_results_folder_that_cannot_be_written_names_the_folder(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    dangling = tmp_path / "link"
    dangling.symlink_to(tmp_path / "gone")
    for folder, says in [(a_file, "it exists and is not a folder"),
                         (dangling, f"it is a symlink to {tmp_path / 'gone'}, which does not exist"),
                         (a_file / "sub", "Not a directory")]:
        with pytest.raises(sweepresults.ResultsUnwritable) as e:
            sweepresults.ResultsLog(folder)
        assert str(e.value) == f"cannot write the results folder {folder}: {says}"


def _tmpfs(results: Path, *options: str) -> list[str]:
    """Run the sweep in a mount namespace of its own, its results folder a 256 KiB tmpfs."""
    results.mkdir()
    opts = ",".join(("size=256k", *options))
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
            f'mount -t tmpfs -o {opts} tmpfs "$1" && shift && exec "$@"', "sh", str(results)]


def test_a_read_only_results_folder_exits_73_before_anything_changes(rig: Rig) -> None:
    plan = rig.write_plan(points=[{"budget": 8, "topk": 1}])
    before = show(rig.manager, UNIT)
    rc, out = rig.run(plan, wrap=_tmpfs(rig.results, "ro"))
    err = rig.err.read_text()
    assert rc == 73, (out, err)
    assert f"cannot write the results folder {rig.results}: Read-only file system" in err and "Traceback" not in err
    assert show(rig.manager, UNIT) == before
    assert rig.manager.show(UNIT, "DropInPaths")["DropInPaths"] == ""


def test_a_disk_that_fills_mid_sweep_stops_cleanly_and_restores_the_unit(rig: Rig) -> None:
    plan = rig.write_plan(points=[{"budget": b, "topk": 1} for b in (8, 16, 32)], mode="fill")
    rc, out = rig.run(plan, wrap=_tmpfs(rig.results))
    err = rig.err.read_text()
    assert rc == 73, (out, err)
    assert f"cannot write the results folder {rig.results}: No space left on device" in err, err
    assert "Traceback" not in err and "back on its own configuration" in err
    assert len(rig.ran.read_text().splitlines()) == 1  # point 1 ran; the sweep stopped before point 2's
    rig.assert_restored()


def test_sighup_is_handled_like_sigterm(rig: Rig) -> None:
    """A closed SSH terminal sends SIGHUP: the point is invalidated and the unit restored, as for SIGTERM."""
    plan = rig.write_plan(points=[{"n": i, "budget": 8, "topk": i} for i in (1, 2)], mode="block-at-2")
    p = rig.sweep(plan)
    wait_for(lambda: (rig.tmp / "marker").exists() or p.poll() is not None, 60, "point 2's command running")
    p.send_signal(signal.SIGHUP)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 130, (out, rig.err.read_text())
    assert [(ln["point"]["n"], ln["status"]) for ln in rig.results_lines()] == [(1, "ok"), (2, "invalidated")]
    assert "SIGHUP: stopping the running command" in rig.err.read_text()
    rig.assert_restored()


def test_a_killed_sweeps_dropin_is_named_refused_to_others_and_restored(rig: Rig) -> None:
    plan = rig.write_plan(points=[{"n": 1, "budget": 8, "topk": 1}], mode="block-at-1")
    first = rig.sweep(plan)
    marker = rig.tmp / "marker"
    wait_for(lambda: (marker.exists() and marker.read_text()) or first.poll() is not None, 60, "the command running")
    dropin = Path(rig.manager.env["XDG_RUNTIME_DIR"]) / "systemd" / "user" / f"{UNIT}.d" / sweepdropin.DROPIN_NAME
    owner = sweepdropin.owner_of(dropin.read_text())
    assert owner is not None and owner["pid"] == first.pid and owner["results"] == str(rig.results)
    assert owner["plan"] == str(plan) and f"(pid {first.pid}, started " in dropin.read_text()

    assert rig.g.get("/status")[1]["targets"]["t"]["warnings"] == []  # a running sweep's drop-in: no warning
    # A second sweep of the same unit, while the first runs: refused, naming the first.
    other = subprocess.run([*GENREADY, "sweep", str(plan), "--results", str(rig.tmp / "other"), "--config",
                            str(rig.g.config_path)], env=rig.manager.env, capture_output=True, text=True, timeout=60)
    assert other.returncode == 75, other.stderr
    assert f"belongs to a running sweep pid {first.pid}" in other.stderr and str(rig.results) in other.stderr
    assert str(plan) in other.stderr
    restore = [*GENREADY, "sweep", "restore", "t", "--config", str(rig.g.config_path)]
    early = subprocess.run(restore, env=rig.manager.env, capture_output=True, text=True, timeout=60)
    assert early.returncode == 75 and f"kill -TERM {first.pid}" in early.stderr, early.stderr

    # kill -9: nothing cleans up; the unit keeps the point's configuration ...
    first.kill()
    first.wait(10)
    os.kill(int(marker.read_text()), signal.SIGKILL)  # the command, in its own session
    assert dropin.exists()
    assert "--model" in Path(f"/proc/{rig.g.get('/ready/t')[1]['pid']}/cmdline").read_text()
    # ... and the daemon says so: /status, `genready status`, the gauge, the log (once).
    warning = (f"{UNIT} runs the configuration of an interrupted sweep ({dropin}, plan {plan}, sweep pid "
               f"{first.pid} gone); restore it with: genready sweep restore t")
    for _ in range(2):
        assert warning in rig.g.get("/status")[1]["targets"]["t"]["warnings"]
    text = subprocess.run([*GENREADY, "status", "--config", str(rig.g.config_path)], capture_output=True,
                          text=True, timeout=30).stdout
    assert f"warning: t: {warning}" in text, text
    gauge = f'genready_sweep_dropin_orphaned{{target="t",unit="{UNIT}"}}'
    assert f"{gauge} 1.0" in rig.g.get("/metrics")[1]
    assert rig.g.log().count("runs the configuration of an interrupted sweep") == 1
    # ... until `genready sweep restore`.
    done = subprocess.run(restore, env=rig.manager.env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"sweep pid {first.pid}" in done.stderr and "gone" in done.stderr and "verified" in done.stderr
    rig.assert_restored()
    assert f"{gauge} 0.0" in rig.g.get("/metrics")[1] and rig.g.get("/status")[1]["targets"]["t"]["warnings"] == []
    again = subprocess.run(restore, env=rig.manager.env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "nothing to restore" in again.stderr


def test_shards_then_report_merges_the_folders_with_the_bench_figures(rig: Rig) -> None:
    """Two shards of a 2 x 2 plan into two folders (as two hosts would), each summary with the bench
    client's figures; `report` over both: one table in plan order, the best values marked."""
    doc = {"target": "t", "timeout": 20,
           "command": [PY, "-m", "genready.benchclient", "--url", rig.url, "-n", "4", "-c", "{c}", "--max-tokens",
                       "6", "--output", "{out}/bench.jsonl"],
           "dropin": '[Service]\nEnvironment="SIM_FLAGS=--spec-accept {accept} --token-latency 0.001"\n',
           "matrix": {"accept": [2, 3], "c": [1, 2]}}
    plan = rig.tmp / "plan.toml"
    plan.write_text(tomli_w.dumps(doc))
    folders = []
    for k in (1, 2):
        rig.results = rig.tmp / f"host{k}"
        rc, out = rig.run(plan, "--shard", f"{k}/2")
        assert rc == 0, out
        head, first_row = out.splitlines()[:2]
        # DRAFT ACC: the simulator answers SGLang 0.5.12's per-request draft counts (issue 38 §4)
        assert head.endswith("ACCEPT  DRAFT ACC  OUT tok/s  TTFT p50 ms  ITL p50 ms"), out
        assert re.search(rf" {1 + k}\.00\*? ", first_row), out  # the simulator's accept length, per point
        assert f"2/2 points ok (shard {k}/2), 1 load" in out
        folders.append(str(rig.results))
    assert [ln["point"]["accept"] for ln in rig.results_lines()] == [3, 3]  # shard 2: the second configuration
    report = [*GENREADY, "sweep", "report", *folders]
    table = subprocess.run(report, capture_output=True, text=True, timeout=30, check=True).stdout
    rows = [ln for ln in table.splitlines() if ln.startswith("accept=")]
    assert [r.split()[:2] for r in rows] == [["accept=2", "c=1"], ["accept=2", "c=2"], ["accept=3", "c=1"],
                                             ["accept=3", "c=2"]], table
    assert all(" 2.00 " in r for r in rows[:2]) and all(" 3.00* " in r for r in rows[2:]), table
    data = json.loads(subprocess.run([*report, "--format", "json"], capture_output=True, text=True, timeout=30,
                                     check=True).stdout)
    assert [r["accept_length"] for r in data["rows"]] == [2.0, 2.0, 3.0, 3.0]
    assert all("accept_length" in r["best"] for r in data["rows"][2:]) and all(r["host"] for r in data["rows"])
    # per position (issue 38 §4): the simulator's histogram; the shares of steps sum to accept length - 1
    assert "ACC/POS" in table[table.index("POINT"):].splitlines()[0], table  # the table, after the Decision
    assert all(r["accept_per_position"] and sum(r["accept_per_position"]) == pytest.approx(r["accept_length"] - 1,
                                                                                          abs=0.01)
               for r in data["rows"]), data
    md = subprocess.run([*report, "--format", "markdown"], capture_output=True, text=True, timeout=30).stdout
    assert md.startswith("## Decision\n") and "\n| POINT | STATUS |" in md and "| **3.00** |" in md
    csv_out = subprocess.run([*report, "--format", "csv"], capture_output=True, text=True, timeout=30).stdout
    assert csv_out.splitlines()[0].startswith("POINT,STATUS,ATTEMPT,PID,LOAD s,RUN s,ACCEPT,")
    bad = subprocess.run([*GENREADY, "sweep", "report", folders[0], str(rig.tmp)], capture_output=True, text=True,
                         timeout=30)
    assert bad.returncode == 65 and f"{rig.tmp}: no results.jsonl" in bad.stderr, bad.stderr


def test_a_runtime_dir_the_manager_does_not_search_exits_1_before_anything_changes(rig: Rig) -> None:
    # XDG_RUNTIME_DIR not the manager's: a drop-in written under it would be ignored, and the points would
    # run on the unit's own configuration. control.NotOnUnitPath, mapped by the sweep to exit 1 in its words.
    plan = rig.write_plan(points=[{"n": 1, "budget": 8, "topk": 1}])
    pid = rig.g.get("/ready/t")[1]["pid"]
    elsewhere = {"XDG_RUNTIME_DIR": str(rig.tmp / "elsewhere")}
    code, _ = rig.run(plan, env=elsewhere)
    says = (f"genready: the user manager does not load units from {rig.tmp / 'elsewhere'}/systemd/user (its UnitPath: ")
    err = rig.err.read_text()
    assert code == 1 and says in err and "is XDG_RUNTIME_DIR the manager's?" in err and "Traceback" not in err, err
    restore = subprocess.run([*GENREADY, "sweep", "restore", "t", "--config", str(rig.g.config_path)],
                             env={**rig.manager.env, **elsewhere}, capture_output=True, text=True, timeout=60)
    assert restore.returncode == 1 and says in restore.stderr and "Traceback" not in restore.stderr, restore.stderr
    assert not rig.results.exists() and not (rig.tmp / "elsewhere").exists()
    assert rig.g.get("/ready/t")[1]["pid"] == pid  # the unit was not restarted


def test_what_a_point_command_leaves_behind_is_ended_before_the_next_point(rig: Rig) -> None:
    """Each point's command runs in guard's process-group runner: a background child it forked and
    left running is ended when the command exits, so the next point is not measured next to it."""
    # Alive: in /proc and not a zombie (an ended child of an exited command waits for whoever reaps orphans).
    script = ('prev="$1/child-$(($2 - 1)).pid"\n'
              'state=$([ -f "$prev" ] && sed "s/.*) //" "/proc/$(cat "$prev")/stat" 2>/dev/null | cut -c1)\n'
              'if [ -n "$state" ] && [ "$state" != Z ]; then echo alive > "$1/leftover-$2"; fi\n'
              'sleep 300 & echo $! > "$1/child-$2.pid"\n')
    plan = rig.tmp / "plan.toml"
    plan.write_text(tomli_w.dumps({"target": "t", "timeout": 20, "command": ["sh", "-c", script, "sh", str(rig.tmp),
                                                                              "{n}"],
                                   "points": [{"n": 1}, {"n": 2}, {"n": 3}]}))
    rc, out = rig.run(plan)
    assert rc == 0, out
    assert [ln["status"] for ln in rig.results_lines()] == ["ok", "ok", "ok"]
    assert not list(rig.tmp.glob("leftover-*")), "a point ran next to the previous point's leftover process"
    children = [int((rig.tmp / f"child-{n}.pid").read_text()) for n in (1, 2, 3)]
    assert not any(alive(pid) for pid in children)
    assert "sh exited leaving 1 process(es) in its process group; they were ended" in rig.err.read_text()
