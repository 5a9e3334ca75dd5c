"""The sweep asks the engine what it runs before each point's run (issue 38 §2).

The plan's `expect` key; a point whose engine reports another value than its flags (the simulator's
--engine-report) or than `expect` (a later drop-in's ExecStart= overriding the plan's) is config_mismatch
and its command never runs; an unconfirmed flag is a warning and the point runs; a speculative server
that drafts nothing is no_drafting. Then the real llama-server, where it is built: the engine's report
is recorded (its `-m ${MODEL}` compared as the server got it), and a later drop-in's -np is caught by `expect`.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from genready.compat import tomllib
from genready.config import ConfigError
from genready.sweep import plan as sweepplan
from genready.sweep.report import collect
from genready.sweep.report import table as sweepreport
from genready_dev import realservers
from genready_dev.harness import GENREADY, PY, Genready, free_port, wait_for
from genready_dev.usermanager import UserManager
from tests import ci
from tests.test_sweep import FAST, UNIT, Rig

# --- the plan key --------------------------------------------------------------------------------------------


def plan(text: str) -> sweepplan.Plan:
    return sweepplan.parse_plan(tomllib.loads(text), "plan.toml")


def test_expect_renders_each_points_values() -> None:
    p = plan('command = "x"\nexpect = { speculative_num_steps = "{steps}", "speculative_config.method" = "eagle", '
             'tp_size = 2 }\n[matrix]\nsteps = [3, 5]\n')
    assert [p.expect_for(pt) for pt in p.points] == [
        {"speculative_num_steps": str(s), "speculative_config.method": "eagle", "tp_size": "2"} for s in (3, 5)]
    assert plan('command = "x"\n[matrix]\na = [1]\n').expect == ()


@pytest.mark.parametrize(("text", "key", "says"), [
    ('expect = "steps"', "expect", "a table of ENGINE_KEY"),
    ("expect = {}", "expect", "an empty table"),
    ('expect = { a = { b = "1" } }', "expect.a", "not a table"),
    ('expect = { a = "{nope}" }', "expect.a", "{nope}"),
    ('expect = { a = "{out}" }', "expect.a", "{out} is its folder"),
])
def test_a_bad_expect_names_its_key(text: str, key: str, says: str) -> None:
    with pytest.raises(ConfigError) as e:
        plan(f'command = "x"\n{text}\n[matrix]\nsteps = [1]\n')
    assert e.value.key == key and says in str(e.value) and "plan.toml" in str(e.value), str(e.value)


# --- the report ---------------------------------------------------------------------------------------------


def test_the_report_names_the_keys_that_differ_and_configurations_whose_engines_report_the_same(
        tmp_path: Path) -> None:
    lines = []
    for i, (dropin, steps, status) in enumerate([("d1", 3, "ok"), ("d2", 5, "ok"), ("d3", 5, "config_mismatch")], 1):
        lines.append({"point": {"steps": i}, "index": i, "status": status, "attempt": 1, "out": f"{i:02d}",
                      "fingerprint": {"dropin": dropin},
                      "engine_config": {"values": {"speculative_num_steps": steps, "port": 1}, "sources": []}})
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(ln) + "\n" for ln in lines))
    text = sweepreport.render(collect.rows_of([tmp_path]))
    assert "engine keys that differ across points: speculative_num_steps\n" in text, text
    assert "warning: steps=2 and steps=3 differ in their server values but their engines report the same" in text
    assert "steps=1 and" not in text
    assert "(config_mismatch: its engine reports another configuration" in text


def test_engine_key_names_reach_the_terminal_escaped(tmp_path: Path) -> None:
    """Issue 53 #11: an engine's key names are its words, not ours."""
    lines = [{"point": {"steps": i}, "index": i, "status": "ok", "attempt": 1, "out": f"{i:02d}",
              "engine_config": {"values": {"\x1b]0;pwned\x07k": i}, "sources": []}} for i in (1, 2)]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(ln) + "\n" for ln in lines))
    text = sweepreport.render(collect.rows_of([tmp_path]))
    assert "engine keys that differ across points: \\x1b]0;pwned\\x07k\n" in text and "\x1b" not in text, text


# --- sweeps on the simulator ------------------------------------------------------------------------------


@pytest.fixture
def openai_rig(manager: UserManager, tmp_path: Path) -> Any:
    """A rig whose target speaks /v1/completions: what the llama.cpp and vLLM profiles serve."""
    r = Rig(manager, tmp_path, {"api": "openai-completions"})
    yield r
    r.close()


def sim_dropin(rig: Rig, flags: str) -> str:
    """The point's server: the simulator under a profile, its flags the point's (the unit's own has none)."""
    return (f"[Service]\nExecStart=\nExecStart={PY} -m genready.cli simulate --port {rig.port} --load-seconds 0.2 "
            f"{flags}\n")


def ran_points(rig: Rig) -> list[dict[str, Any]]:
    """The points whose command ran (the command appends its point to rig.ran)."""
    return [json.loads(ln) for ln in rig.ran.read_text().splitlines()] if rig.ran.exists() else []


@pytest.mark.system
def test_an_engine_that_runs_other_flags_is_config_mismatch_and_its_command_never_runs(rig: Rig) -> None:
    plan_path = rig.write_plan(
        points=[{"steps": 3, "extra": ""}, {"steps": 4, "extra": "--engine-report speculative_num_steps=2"}],
        dropin=sim_dropin(rig, "--profile sglang --speculative-algorithm EAGLE --speculative-num-steps {steps} "
                               "{extra}"),
        expect={"speculative_num_steps": "{steps}", "speculative_algorithm": "EAGLE"})
    rc, out = rig.run(plan_path)
    assert rc == 1, out
    ok, bad = rig.results_lines()
    assert ok["status"] == "ok" and ok["engine_config"]["values"]["speculative_num_steps"] == 3, ok
    assert ok["engine_config"]["sources"] == ["GET /server_info"]
    assert {"speculative_num_steps", "speculative_algorithm"} <= set(ok["config_check"]["confirmed"])
    assert bad["status"] == "config_mismatch" and bad["exit_code"] is None and bad["run_seconds"] is None, bad
    assert "--speculative-num-steps 4 but the engine reports speculative_num_steps=2" in bad["reason"], bad
    assert "expect.speculative_num_steps 4 but the engine reports speculative_num_steps=2" in bad["reason"]
    assert {"flag": "--speculative-num-steps", "key": "speculative_num_steps", "expected": "4", "reported": 2} \
        in bad["config_check"]["mismatches"]
    assert [p["steps"] for p in ran_points(rig)] == [3]  # the mismatched point's command never ran
    assert not (rig.results / bad["out"] / "stdout.log").exists()
    assert len([ln for ln in rig.results_lines() if ln["point"]["steps"] == 4]) == 1  # not retried
    err = rig.err.read_text()
    assert "not running the command: the engine runs another configuration (--speculative-num-steps 4" in err
    assert "config_mismatch" in out and "1/2 points ok" in out
    rig.assert_restored()


@pytest.mark.system
def test_a_later_dropins_execstart_is_caught_by_expect(rig: Rig) -> None:
    # Another drop-in of the unit, sorted after the sweep's (zz-genready-sweep.conf): its ExecStart= wins.
    d = rig.manager.unit_dir / f"{UNIT}.d"
    d.mkdir(exist_ok=True)
    (d / "zzz-override.conf").write_text(sim_dropin(rig, "--profile sglang --speculative-algorithm EAGLE "
                                                         "--speculative-num-steps 5"))
    try:
        plan_path = rig.write_plan(
            points=[{"steps": 3}, {"steps": 5}],
            dropin=sim_dropin(rig, "--profile sglang --speculative-algorithm EAGLE --speculative-num-steps {steps}"),
            expect={"speculative_num_steps": "{steps}"})
        rc, out = rig.run(plan_path)
        assert rc == 1, out
        three, five = rig.results_lines()
        assert three["status"] == "config_mismatch", three
        assert three["reason"] == "expect.speculative_num_steps 3 but the engine reports speculative_num_steps=5"
        assert five["status"] == "ok" and five["config_check"]["mismatches"] == [], five
        assert [p["steps"] for p in ran_points(rig)] == [5]
    finally:
        (d / "zzz-override.conf").unlink()
        rig.manager.systemctl("daemon-reload")


# --- the engine asked by the target's kind, and the flags the server got (issues 49 §1, 53 item 1) ---------

# A launcher whose command line names no server (`python launch.py ...`): the simulator under SGLang's profile
LAUNCH = """import sys
from genready import cli
sys.exit(cli.main(["simulate", "--profile", "sglang", *sys.argv[1:]]))
"""


def wrappers(rig: Rig) -> tuple[Path, Path]:
    """A shell script that execs the simulator (`ExecStart=/opt/run-sglang.sh`), and a Python launcher."""
    script, launch = rig.tmp / "run-sglang.sh", rig.tmp / "launch.py"
    script.write_text(f'#!/bin/sh\nexec {PY} -m genready.cli simulate --profile sglang "$@"\n')
    script.chmod(0o755)
    launch.write_text(LAUNCH)
    return script, launch


def server_dropin(rig: Rig) -> str:
    """The point's `{server}` with the simulator's flags; the variables for a server whose flags use them."""
    return (f"[Service]\nEnvironment=MODEL=/models/m-{{steps}} STEPS={{steps}}\nExecStart=\n"
            f"ExecStart={{server}} --port {rig.port} --load-seconds 0.2 --speculative-algorithm EAGLE\n")


@pytest.mark.system
def test_an_expect_is_checked_behind_a_wrapper_and_never_passes_unchecked(rig: Rig) -> None:
    # The target says nothing of its kind (kind = "auto", api = "sglang"): the process that serves it does
    script, launch = wrappers(rig)
    sim = f"{PY} -m genready.cli simulate --profile sglang"
    plan_path = rig.write_plan(
        points=[{"steps": 3, "server": f"{script} --speculative-num-steps 5"},  # the engine runs 5: contradicted
                {"steps": 5, "server": f"{sim} --model-path ${{MODEL}} --speculative-num-steps $STEPS"},  # ok
                {"steps": 5, "server": f"{PY} {launch} --speculative-num-steps 5"}],  # no kind: cannot be checked
        dropin=server_dropin(rig), expect={"speculative_num_steps": "{steps}"})
    _, status = rig.g.get("/status")
    t = status["targets"]["t"]
    assert t["kind"] == {"name": None, "from": "unknown", "pid": t["pid"]}, t  # the unit's own simulate: no profile
    rc, out = rig.run(plan_path)
    assert rc == 1, out
    wrapped, variables, unknown = rig.results_lines()
    assert wrapped["status"] == "config_mismatch", wrapped
    assert wrapped["reason"] == "expect.speculative_num_steps 3 but the engine reports speculative_num_steps=5"
    assert variables["status"] == "ok", variables
    assert {"model_path", "speculative_num_steps"} <= set(variables["config_check"]["confirmed"]), variables
    assert variables["engine_config"]["values"]["model_path"] == "/models/m-5"
    assert unknown["status"] == "config_mismatch" and unknown["exit_code"] is None, unknown
    assert unknown["reason"].startswith(f"expect cannot be checked: {UNIT} runs no server kind genready knows"), unknown
    assert [p["steps"] for p in ran_points(rig)] == [5]  # only the checked point ran
    err = rig.err.read_text()
    assert "SGLang says what it runs: " in err and "(its kind from process)" in err, err
    rig.assert_restored()


@pytest.fixture
def sglang_rig(manager: UserManager, tmp_path: Path) -> Any:
    r = Rig(manager, tmp_path, {"kind": "sglang"})
    yield r
    r.close()


@pytest.mark.system
def test_the_targets_kind_asks_an_engine_whose_command_line_names_none(sglang_rig: Rig) -> None:
    rig = sglang_rig
    _, launch = wrappers(rig)
    server = f"{PY} {launch} --speculative-num-steps 5"
    plan_path = rig.write_plan(points=[{"steps": 3, "server": server}, {"steps": 5, "server": server}],
                               dropin=server_dropin(rig), expect={"speculative_num_steps": "{steps}"})
    _, status = rig.g.get("/status")
    t = status["targets"]["t"]
    assert t["kind"] == {"name": "sglang", "from": "config", "pid": t["pid"]}, t
    rc, out = rig.run(plan_path)
    assert rc == 1, out
    three, five = rig.results_lines()
    assert three["status"] == "config_mismatch", three
    assert three["reason"] == "expect.speculative_num_steps 3 but the engine reports speculative_num_steps=5"
    # the launcher's own flags are compared too (its command line is what the server got): EAGLE is not expected
    assert five["status"] == "ok" and five["config_check"]["mismatches"] == [], five
    assert {"speculative_num_steps", "speculative_algorithm"} <= set(five["config_check"]["confirmed"]), five
    assert [p["steps"] for p in ran_points(rig)] == [5]
    assert "(its kind from config)" in rig.err.read_text()


GEN = r'''
import json, sys, urllib.request
url, n = sys.argv[1], int(sys.argv[2])
for _ in range(n):
    req = urllib.request.Request(url + "/v1/completions", method="POST", headers={"Content-Type": "application/json"},
                                 data=json.dumps({"prompt": "The quick", "max_tokens": 8}).encode())
    urllib.request.urlopen(req, timeout=10).read()
'''


@pytest.mark.system
def test_an_unconfirmed_flag_warns_and_runs_and_a_server_that_drafts_nothing_is_no_drafting(openai_rig: Rig
                                                                                           ) -> None:
    rig = openai_rig
    gen = rig.tmp / "gen.py"
    gen.write_text(GEN)
    llama = "--profile llamacpp --model tiny.gguf --spec-type draft-simple --spec-draft-n-max 8"
    vllm = '--profile vllm --spec-accept 2.0 --speculative-config \'{"method":"eagle","num_speculative_tokens":3}\''
    plan_path = rig.write_plan(
        points=[{"server": llama, "gen": 2}, {"server": vllm, "gen": 0}, {"server": vllm, "gen": 2}],
        dropin=sim_dropin(rig, "{server}"), command=[PY, str(gen), rig.url, "{gen}"])
    rc, out = rig.run(plan_path)
    assert rc == 1, out
    lines = rig.results_lines()
    assert [ln["status"] for ln in lines] == ["ok", "no_drafting", "ok"], lines
    err = rig.err.read_text()
    assert "not confirmed by the engine (it does not report them): --spec-draft-n-max 8" in err, err
    assert lines[0]["config_check"]["unconfirmed"] == [{"flag": "--spec-draft-n-max", "key": "speculative.n_max",
                                                        "expected": "8"}]
    assert lines[0]["engine_config"]["values"]["model_path"] == "tiny.gguf"
    assert lines[0]["engine_config"]["values"]["speculative"] is True  # its slot drafts: but no counters to judge
    drafted = lines[1]
    assert drafted["exit_code"] == 0 and "drafted no token" in drafted["reason"], drafted
    assert drafted["engine_config"]["values"]["speculative_config.num_speculative_tokens"] == 3
    assert lines[2]["restarted"] is False  # the vLLM instance, reused: its report was read once, at its load
    assert err.count("vLLM says what it runs:") == 1 and err.count("llama.cpp says what it runs:") == 1, err
    assert "no 'non-default args:' line" not in err
    assert "no_drafting" in out and "engine keys that differ across points:" in out


# --- the real llama-server ---------------------------------------------------------------------------------


@pytest.mark.system
@pytest.mark.real_servers
def test_the_real_llama_servers_report_is_recorded_and_a_later_np_is_caught(manager: UserManager,
                                                                             tmp_path: Path) -> None:
    ci.require(realservers.missing("llama-server"), "a sweep of the real llama-server")
    tiny = sorted((realservers.cache_dir() / "models").glob("tiny-*.gguf"))[:1]
    ci.require(None if tiny else "no tiny model (`./dev real-servers` makes it)", "a sweep of the real llama-server")
    llama, port = realservers.llama_server(), free_port()
    url, unit = f"http://127.0.0.1:{port}", "llama-confirm.service"
    # the model from the unit's Environment= (issue 53 item 1): compared as the server got it, not as `${MODEL}`
    server = f"{llama} -m ${{MODEL}} -c 1024 -lm none -t 1 -tb 1 --host 127.0.0.1 --port {port}"
    frag = manager.install_unit(unit, f"[Unit]\nStartLimitIntervalSec=0\n[Service]\nEnvironment=MODEL={tiny[0]}\n"
                                      f"ExecStart={server} -np 1\n"
                                      f"TimeoutStopSec=10\nStandardError=append:{tmp_path / 'llama.log'}\n")
    manager.systemctl("start", unit)
    g = Genready(manager, tmp_path, {"llama": {"unit": unit, "url": url, "api": "openai-completions", **FAST,
                                               "probe_timeout": 10.0}}).start()
    d = frag.parent / f"{unit}.d"
    try:
        wait_for(lambda: g.get("/ready/llama")[0] == 200, 60, "the unit's first start verified")
        plan_path = tmp_path / "plan.toml"
        plan_path.write_text(tomli_w.dumps({
            "target": "llama", "timeout": 60, "command": [PY, "-c", "pass"], "warmup": 0,
            "dropin": f"[Service]\nExecStart=\nExecStart={server} -np {{np}}\n", "expect": {"total_slots": "{np}"},
            "matrix": {"np": [1, 2]}}))
        d.mkdir(exist_ok=True)  # a later drop-in: every start runs -np 1, whatever the plan's drop-in says
        (d / "zzz-override.conf").write_text(f"[Service]\nExecStart=\nExecStart={server} -np 1\n")
        manager.systemctl("daemon-reload")
        p = subprocess.run([*GENREADY, "sweep", str(plan_path), "--results", str(tmp_path / "r"), "--config",
                            str(g.config_path)], env=manager.env, capture_output=True, text=True, timeout=300)
        print(p.stdout, p.stderr[-3000:])
        assert p.returncode == 1, p.stdout + p.stderr
        one, two = (json.loads(ln) for ln in (tmp_path / "r" / "results.jsonl").read_text().splitlines())
        assert one["status"] == "ok", one
        values = one["engine_config"]["values"]
        assert values["model_path"] == str(tiny[0]) and values["total_slots"] == 1, values
        assert "model_path" in one["config_check"]["confirmed"], one  # -m ${MODEL}, as the server got it
        assert one["engine_config"]["sources"] == ["GET /props", "GET /slots"]
        assert two["status"] == "config_mismatch" and two["exit_code"] is None, two
        assert two["reason"] == "expect.total_slots 2 but the engine reports total_slots=1", two
    finally:
        g.stop()
        (d / "zzz-override.conf").unlink(missing_ok=True)
        manager.systemctl("stop", unit, check=False)
        manager.remove_unit(unit)
