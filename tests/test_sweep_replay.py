"""`sweep replay` (issue 52 §2): the schedule's drop-in, parsed back the way each engine parses it, the engine's
own report that confirms it, and the replay's verdict per load: a level below 0.90x of the best static is a
regression, and the Decision then deploys the static configuration.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from genready.servers import engineconfig as ec
from genready.servers import kinds, schedules
from genready.sweep.plan import parse_plan
from genready.sweep.replay import quoted, replay_plan, with_schedule, words_of
from genready.sweep.report import collect
from genready.sweep.report import replay as verdict
from genready.sweep.report.main import report_main
from genready_dev import simadaptive, simbatch
from tests.test_sweep_decision import Folder, section
from tests.test_sweep_schedule import LOADS, MOVING, NOISE, planned, sglang_steps, sweep, vllm_lookup

PLAN: dict[str, Any] = {
    "command": ["bench", "-n", "64", "-c", "{c}", "--seed", "1", "--output", "{out}/bench.jsonl"],
    "matrix": {"steps": [1, 3, 5], "c": list(LOADS)}, "repeats": 3, "baseline": {"steps": 0},
    "dropin": "[Service]\nExecStart=\nExecStart=/usr/bin/vllm serve m --port 8000 \\\n"
              "  --speculative-config '{{\"method\":\"eagle3\",\"num_speculative_tokens\":{steps}}}' "
              "--log \"%h/{out} log\" $EXTRA\n",
    "expect": {"speculative_config.num_speculative_tokens": "{steps}"}}
SGLANG_DROPIN = ("[Service]\nExecStart=/usr/bin/python3 -m sglang.launch_server --model-path m "
                 "--speculative-algorithm EAGLE --speculative-eagle-topk 1 --speculative-num-steps {steps} "
                 "--speculative-num-draft-tokens 4\n")


def without(d: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k != key}


def replay_folder(path: Path, engine: str, tps_at: dict[int, float], tiers: list[list[int]] | None = None) -> None:
    """DIR/replay as `sweep replay` leaves it: its schedule.json and a line per load and repeat."""
    s = planned(Folder(path))
    r = Folder(path / verdict.REPLAY_DIR, baseline=False)
    for i, c in enumerate(LOADS, 1):
        for rep, k in enumerate(NOISE, 1):
            r.run(i, {"steps": "schedule", "c": c}, tps_at[c] * k, rep)
    (r.path / "results.jsonl").write_text("".join(r.lines))
    (r.path / verdict.SCHEDULE_FILE).write_text(json.dumps(
        {"engine": engine, "axis": s.axis, "tiers": tiers or [list(t) for t in s.tiers()]}))


BEST = {1: 240.0, 8: 900.0, 32: 2300.0, 64: 3000.0}  # MOVING's best static at each load


def test_the_drop_in_carries_vllms_schedule_as_vllm_reads_it_and_keeps_every_other_word() -> None:
    plan = parse_plan(PLAN, "plan.toml")
    s = planned_moving()
    replayed, dropin, expect = replay_plan(plan, s, [{"c": c} for c in LOADS], schedules.PER_BATCH_SIZE, "")
    line = next(ln for ln in dropin.splitlines() if ln.startswith("ExecStart=/"))
    words = [w for _, w in words_of(line.removeprefix("ExecStart="))]
    # the other words as written (a quoted word with its specifier, systemd's $EXTRA), the config one JSON word
    assert '"%h/{out} log"' in line and "$EXTRA" in line and words[:5] == ["/usr/bin/vllm", "serve", "m", "--port",
                                                                           "8000"]
    config = json.loads(schedules.flag_value(words, schedules.VLLM_CONFIG_FLAGS) or "")
    assert config["method"] == "eagle3" and config["num_speculative_tokens"] == 5
    dense = vllm_lookup(config, max_batch_size=128)  # vLLM's own reading (vllm/v1/spec_decode/dynamic/utils.py)
    assert [dense[c] for c in LOADS] == [5, 3, 1, 0]
    assert list(simbatch.vllm_depths(config["num_speculative_tokens_per_batch_size"], 128, 5)) == dense
    # one point per load, the same command (prompts, seed) and repeats; no baseline (a drop-in with {out} loads
    # the unit for each point, as in the sweep)
    assert [p.as_dict() for p in replayed.points] == [{"steps": "schedule", "c": c} for c in LOADS]
    assert replayed.command_for(replayed.points[2], "/o") == plan.command_for(plan.points[2], "/o")
    assert replayed.repeats == 3 and replayed.baseline is None
    # {out} stays the point's folder; a % in it doubled for systemd, as in any sweep's drop-in
    assert "%h//r/a%%b log" in (replayed.dropin_for(replayed.points[0], "/r/a%b") or "")
    # the engine's own report must show the schedule: vLLM's start line names its whole speculative_config
    assert replayed.expect_for(replayed.points[0]) == expect == {
        "speculative_config.num_speculative_tokens": "5",
        "speculative_config.num_speculative_tokens_per_batch_size": "[[1,2,5],[3,16,3],[17,45,1],[46,64,0]]"}
    args_line = f"non-default args: {{'speculative_config': {config!r}}}"
    reported = ec.flatten(ec.dict_repr(args_line.partition(': ')[2]))
    read = kinds.VLLM.engine
    assert read is not None
    conf = ec.with_expect(ec.compare(read, ec.expected(read, words[3:]), reported), expect, reported)
    assert not conf.mismatches
    assert "speculative_config.num_speculative_tokens_per_batch_size" in conf.confirmed
    other = ec.flatten({"speculative_config": {**config, "num_speculative_tokens_per_batch_size": [[1, 64, 5]]}})
    assert ec.with_expect(ec.compare(read, ec.expected(read, words[3:]), other), expect, other).mismatches


def planned_moving() -> Any:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        return planned(sweep(Path(d), MOVING))


def test_the_drop_in_carries_sglangs_schedule_and_its_file_as_sglang_reads_them(tmp_path: Path) -> None:
    plan = parse_plan(without(PLAN, "expect") | {"dropin": SGLANG_DROPIN}, "plan.toml")
    s = planned_moving()
    path = str(tmp_path / "adaptive %.json")
    replayed, dropin, expect = replay_plan(plan, s, [{"c": c} for c in LOADS], schedules.ADAPTIVE, path)
    assert len(replayed.groups()) == 1  # one drop-in for every load: the unit loaded once
    words = [w for _, w in words_of(dropin.splitlines()[1].removeprefix("ExecStart="))]
    assert schedules.flag_value(words, ("--speculative-num-steps",)) == "5"
    assert schedules.flag_value(words, ("--speculative-num-draft-tokens",)) == "6"  # SGLang's steps + 1
    assert "--speculative-adaptive" in words and schedules.flag_value(words, ("--speculative-adaptive-config",)) \
        == path.replace("%", "%%")  # systemd gives the path back: its % doubled in the unit file
    cfg = json.loads(json.dumps(schedules.ADAPTIVE.file(s.tiers())))
    graphs = list(simadaptive.CUDA_GRAPH_BS)
    assert [sglang_steps(cfg, c, graphs) for c in LOADS] == [5, 3, 1, 0]
    sim = simadaptive.parse(cfg, initial=5)  # the simulator's reading, from SGLang's source
    assert simadaptive.depths_of(sim, LOADS) == [5, 3, 1, 0]
    assert simadaptive.depths_of(sim, range(1, 65)) == [sglang_steps(cfg, b, graphs) for b in range(1, 65)]
    assert expect == {"speculative_adaptive": "true", "speculative_adaptive_config": path,
                      "speculative_num_steps": "5"}


def test_a_drop_in_without_a_speculative_flag_cannot_carry_a_schedule() -> None:
    s = planned_moving()
    for dropin, fmt in (("[Service]\nExecStart=/usr/bin/vllm serve m --x {steps}\n", schedules.PER_BATCH_SIZE),
                        ("[Service]\nExecStart=/usr/bin/python3 -m sglang.launch_server --x {steps}\n",
                         schedules.ADAPTIVE),
                        ("[Service]\nEnvironment=X={steps}\n", schedules.PER_BATCH_SIZE)):
        with pytest.raises(ValueError):
            replay_plan(parse_plan(without(PLAN, "expect") | {"dropin": dropin}, "p.toml"), s, [{"c": 1}], fmt, "")


def test_systemd_words_split_and_quoted_back() -> None:
    assert words_of("a 'b c' \"d \\\" e\" f%%g") == [("a", "a"), ("'b c'", "b c"), ('"d \\" e"', 'd " e'),
                                                     ("f%%g", "f%%g")]
    for w in ("plain", '{"a":[1,2]}', "it's", "back\\slash"):
        assert [x for _, x in words_of(quoted(w))] == [w]
    assert with_schedule("[Service]\nExecStart=\nExecStart=a --x 1\n", lambda ws: [*ws, "--y", "%"]) == \
        "[Service]\nExecStart=\nExecStart=a --x 1 --y %%\n"


def test_a_replay_within_the_noise_is_verified_and_the_schedule_deployed(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    sweep(tmp_path, MOVING)
    replay_folder(tmp_path, "vllm", {c: v * 0.99 for c, v in BEST.items()})
    assert report_main([str(tmp_path)], "table", schedule="vllm") == 0
    out = capsys.readouterr().out
    deploy = section(out)[-1]
    assert deploy.startswith("Deploy: the schedule (steps=5 at c=1, steps=3 at c=8, steps=1 at c=32, speculation "
                             "off at c=64): add ") and "Verified: 0.99x-0.99x the best static" in deploy, deploy
    assert "Replay (vllm)" in out and "c=32: steps=1 by the schedule: 2277.0 output tok/s, 0.99x the best " \
        "static's (steps=1, 2300.0) [95 % interval" in out
    data = json.loads(capture(capsys, tmp_path, "json"))["schedule"]["replay"]
    assert data["verified"] and data["recommended"]
    assert [lv["concurrency"] for lv in data["levels"]] == list(LOADS)
    assert all(not lv["regression"] and 0.98 < lv["speedup"]["value"] < 1.0 for lv in data["levels"])
    assert {"ttft_p50_ms", "itl_p50_ms", "e2e_p50_ms", "ttft_p50_ratio", "e2e_p50_ratio"} <= set(data["levels"][0])
    # E2E p50 here is 8000 / tok/s (tests/test_sweep_decision's Folder): 1 % slower, 1 % longer
    assert data["levels"][0]["e2e_p50_ratio"]["value"] == pytest.approx(1 / 0.99)


def capture(capsys: pytest.CaptureFixture[str], folder: Path, fmt: str, engine: str = "vllm") -> str:
    assert report_main([str(folder)], fmt, schedule=engine) in (0, 1)
    return capsys.readouterr().out


def test_a_level_below_090_is_a_regression_and_the_static_configuration_is_deployed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep(tmp_path, MOVING)
    # vLLM #49548's shape: past a threshold of the table the throughput collapses, here at 32 in flight
    replay_folder(tmp_path, "sglang", {**BEST, 32: BEST[32] * 0.6})
    out = capture(capsys, tmp_path, "table", "sglang")
    assert "c=32: steps=1 by the schedule: 1380.0 output tok/s, 0.60x the best static's (steps=1, 2300.0)" in out
    assert "REGRESSION: below 0.90x of the best static (vLLM #49548's shape)" in out
    assert out.count("REGRESSION") == 1
    deploy = section(out)[-1]
    # the best single static depth over the loads: steps=3 has the highest geometric mean of MOVING
    assert deploy.startswith("Deploy: the plan's drop-in with steps=3, the best static configuration over the "
                             "loads: the schedule is not recommended, the schedule regressed at c=32"), deploy
    assert "--speculative-adaptive" not in deploy
    data = json.loads(capture(capsys, tmp_path, "json", "sglang"))
    rp = data["schedule"]["replay"]
    assert not rp["recommended"] and not rp["verified"] and rp["fallback"] == 3
    assert [lv["regression"] for lv in rp["levels"]] == [False, False, True, False]
    assert data["decision"]["deploy"].startswith("Deploy: the plan's drop-in with steps=3")
    html = pytest.importorskip("matplotlib") and capture(capsys, tmp_path, "html", "sglang")
    assert 'id="replay"' in html and "REGRESSION" in html and 'id="schedule-load"' in html


def test_a_replay_of_another_schedule_or_engine_is_not_used(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    sweep(tmp_path, MOVING)
    replay_folder(tmp_path, "vllm", {**BEST, 32: BEST[32] * 0.6}, tiers=[[1, 64, 5]])
    assert report_main([str(tmp_path)], "table", schedule="vllm") == 0
    got = capsys.readouterr()
    assert "Replay (" not in got.out and section(got.out)[-1].startswith("Deploy: the schedule (")
    assert "not using " + str(tmp_path / verdict.REPLAY_DIR) + ": it ran another schedule" in got.err
    replay_folder_again = tmp_path / verdict.REPLAY_DIR / verdict.SCHEDULE_FILE
    replay_folder_again.write_text(json.dumps({"engine": "vllm", "axis": "steps",
                                               "tiers": [list(t) for t in planned(Folder(tmp_path)).tiers()]}))
    assert "Replay (vllm)" not in capture(capsys, tmp_path, "table", "sglang")
    assert "Replay (vllm)" in capture(capsys, tmp_path, "table", "vllm")


def test_the_replay_verdict_needs_an_ok_run_at_every_load(tmp_path: Path) -> None:
    sweep(tmp_path, MOVING)
    replay_folder(tmp_path, "vllm", BEST)
    s = planned(Folder(tmp_path))
    rows = [r for r in collect.rows_of([tmp_path / verdict.REPLAY_DIR]) if r.point.get("c") != 64]
    rp = verdict.replay_of(s, {"c"}, rows, "vllm", "DIR/replay")
    assert not rp.regressed and [lv.load for lv in rp.missing] == [64] and not rp.verified
    assert verdict.summary(rp).startswith("Not verified at c=64")
    assert "c=64: speculation off by the schedule: no ok run in the replay (not run; " in \
        verdict.level_words(rp, rp.levels[-1])
    # a run the engine's report refused (the schedule did not take) is named as such
    for r in rows:
        if r.point.get("c") == 32:
            r.status = "config_mismatch"
    rp = verdict.replay_of(s, {"c"}, rows, "vllm", "DIR/replay")
    assert [lv.status for lv in rp.levels] == ["ok", "ok", "config_mismatch", "not run"]


def test_sglang_adaptive_moves_among_a_tiers_candidates_by_its_ema_and_refuses_what_sglang_refuses() -> None:
    a = simadaptive.parse(simadaptive.DEFAULT_CONFIG, initial=3)
    assert simadaptive.depths_of(a, [1, 8, 9, 31, 32, 64, 200]) == [3, 3, 3, 1, 1, 0, 0]  # 9 pads to 10: tier 8
    for _ in range(10 + 5):  # every draft accepted: after the warmup the slot probes deeper
        a.verified(1, 3.0)
    assert a.steps_for(1) == 5
    for _ in range(40):  # nothing accepted: down to the least candidate
        a.verified(1, 0.0)
    assert a.steps_for(1) == 1
    refused: list[object] = [{"strategy": "fast", "1": {"candidate_steps": [1]}}, {"1": {"candidate_steps": []}},
                             {"1": {"candidate_steps": [-1]}}, {"x": 1}, []]
    for bad in refused:
        with pytest.raises(ValueError):
            simadaptive.parse(bad, initial=3)
    with pytest.raises(ValueError, match="topk=1"):
        simadaptive.check_server("EAGLE", 4)
    with pytest.raises(ValueError, match="EAGLE"):
        simadaptive.check_server("NGRAM", 1)


def test_the_simulators_batch_model_switches_depth_by_sglangs_tiers() -> None:
    from genready_dev import simspec

    spec = simspec.SpecModel(alpha=0.75, steps=5, draft_cost=0.05)
    a = simadaptive.parse(schedules.adaptive_config([(1, 2, 5), (3, 16, 3), (17, 45, 1), (46, 64, 0)]), 5)
    m = simbatch.BatchModel(64, 0.02, 0.001, spec=spec, adaptive=a)
    fixed = {d: simbatch.BatchModel(64, 0.02, 0.001, spec=simspec.SpecModel(alpha=0.75, steps=d, draft_cost=0.05))
             for d in (1, 3, 5)}
    for batch, d in ((1, 5), (8, 3), (32, 1)):
        assert simbatch.step_time(m, batch) == simbatch.step_time(fixed[d], batch)
        assert simbatch.step_gain(m, batch) == simbatch.step_gain(fixed[d], batch)
    assert simbatch.step_gain(m, 64) == 1.0  # depth 0: a plain step


# --- the replay of a real sweep, on the simulator under a real systemd ------------------------------------------

@pytest.fixture
def vllm_rig(manager: Any, tmp_path: Path) -> Any:
    """test_sweep's Rig whose target speaks /v1/completions (the vLLM profile's)."""
    from tests.test_sweep import Rig

    r = Rig(manager, tmp_path, {"api": "openai-completions"})
    yield r
    r.close()


# each engine's speculative flags at {steps}, and what its own report must show after the replay (engine key, value)
ENGINES: dict[str, tuple[str, str, tuple[str, Any]]] = {
    "vllm": ("--profile vllm", "--speculative-config '{{\"method\":\"eagle\",\"num_speculative_tokens\":{steps}}}'",
             ("speculative_config.num_speculative_tokens_per_batch_size", "[[1,4,4],[5,16,0]]")),
    "sglang": ("--profile sglang", "--speculative-algorithm EAGLE --speculative-num-steps {steps}",
               ("speculative_adaptive", True))}


@pytest.mark.system
@pytest.mark.parametrize("engine", ENGINES)
def test_a_real_replay_confirms_the_schedule_took_and_flags_the_load_that_regressed(vllm_rig: Any,
                                                                                     engine: str) -> None:
    """A sweep of depth 4 and the baseline at -c 1 and 16 (deep wins alone, none at 16: simbatch's truth is 80.8
    vs 41.7 tok/s at 1, 157.5 vs 190.5 at 16), its schedule replayed on the simulator switching as the engine
    does (vLLM's lookup, SGLang's adaptive tiers); the replay's server has its running batch capped at 4 (an
    $EXTRA the sweep's had not), so at 16 in flight it runs 4 at a time at depth 4 (132.3 tok/s: 0.69x), a
    regression the report flags and does not deploy."""
    import subprocess

    import tomli_w

    from genready_dev.harness import GENREADY, PY

    rig, env_file = vllm_rig, vllm_rig.tmp / "extra.env"
    profile, flags, (key, value) = ENGINES[engine]
    sim = (f"{PY} -m genready.cli simulate --port {rig.port} --load-seconds 0.2 {profile} --token-latency 0.02 "
           "--batch-max-running 64 --batch-token-seconds 0.004")
    spec = f"--spec-alpha 0.8 --spec-draft-cost 0.02 {flags}"
    plan = {"target": "t", "timeout": 30, "warmup": 2, "repeats": 1, "between_points": "none",
            "command": [PY, "-m", "genready.benchclient", "--url", rig.url, "--api", "openai-completions", "-n", "16",
                        "-c", "{c}", "--max-tokens", "16", "--seed", "1", "--output", "{out}/bench.jsonl"],
            "matrix": {"steps": [4], "c": [1, 16]},
            "dropin": f"[Service]\nEnvironmentFile=-{env_file}\nExecStart=\nExecStart={sim} {spec} $EXTRA\n",
            "baseline": {"steps": 0, "dropin": f"[Service]\nExecStart=\nExecStart={sim}\n"}}
    (rig.tmp / "plan.toml").write_text(tomli_w.dumps(plan))
    rc, out = rig.run(rig.tmp / "plan.toml")
    assert rc == 0, out
    env_file.write_text("EXTRA=--batch-max-running 4\n")
    p = subprocess.run([*GENREADY, "sweep", "replay", str(rig.results), "--schedule", engine, "--config",
                        str(rig.g.config_path)], env=rig.manager.env, capture_output=True, text=True, timeout=300)
    print(p.stdout, p.stderr)
    assert p.returncode == 1, p.stderr  # a load regressed
    ran = json.loads((rig.results / "replay" / "schedule.json").read_text())
    assert ran["tiers"] == [[1, 4, 4], [5, 16, 0]] and ran["engine"] == engine
    lines = [json.loads(ln) for ln in (rig.results / "replay" / "results.jsonl").read_text().splitlines()]
    assert [(ln["point"], ln["status"]) for ln in lines] == [({"steps": "schedule", "c": 1}, "ok"),
                                                             ({"steps": "schedule", "c": 16}, "ok")]
    # one load for both levels, and the engine's own report (vLLM's start line, SGLang's /server_info) confirmed
    # the schedule took
    assert len({ln["invocation_id"] for ln in lines}) == 1
    assert key in lines[0]["config_check"]["confirmed"] and lines[0]["engine_config"]["values"][key] == value
    if engine == "sglang":  # the file it reads the tiers from, as SGLang reads it
        cfg = json.loads(Path(ran["file"]).read_text())
        assert simadaptive.depths_of(simadaptive.parse(cfg, 4), [1, 4, 5, 16]) == [4, 4, 0, 0]
        assert lines[0]["engine_config"]["values"]["speculative_adaptive_config"] == ran["file"]
    assert "c=1: steps=4 by the schedule" in p.stdout and "; ok" in p.stdout
    assert "c=16: speculation off by the schedule" in p.stdout and "REGRESSION" in p.stdout
    assert p.stdout.rstrip().splitlines()[-1].startswith("Deploy: the plan's drop-in with steps=4, the best static")
    rig.assert_restored()
