"""Same prompts, same tokens (issue 50 §2-3): the report pairs each point's answers with its baseline round's, prompt
by prompt, from the request lines the bench client writes (written here by its own RequestLog), and marks a
point whose answers diverge early or degenerate into loops: never best, in the table, the Decision and JSON."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import tomli_w

from genready.compat import tomllib
from genready.config import ConfigError
from genready.sweep import plan as sweepplan
from genready.sweep.report import collect, outputs
from genready.sweep.rows import Row
from genready.tools import textloops
from genready.tools.benchfigures import Outcome
from genready.tools.prompts import Prompt
from genready.tools.requestlog import RequestLog
from genready_dev.harness import GENREADY
from tests.test_sweep import Rig
from tests.test_sweep_decision import Folder, section
from tests.test_sweep_speedup import _speed_plan

PROMPTS = 20
WORDS = textloops.words_of("speculative decoding drafts tokens with a small model and the large model verifies them "
                           "in one step so its answer is the large model's own while the steps are fewer when drafts "
                           "are accepted often")


def answer(i: int) -> str:
    """The baseline's answer to prompt i: 40 words, varied."""
    return " ".join(WORDS[(i + k * 7) % len(WORDS)] + str(k % 3) for k in range(40))


def diverging(i: int, at: float) -> str:
    """Prompt i's answer, equal to the baseline's for its first `at` share of words, then other words."""
    words = answer(i).split()
    keep = int(at * len(words))
    return " ".join(words[:keep] + [f"other{k}" for k in range(len(words) - keep)])


def looping(i: int) -> str:
    words = answer(i).split()
    return " ".join(words[:6] + ["and", "so", "on"] * 12)


def write(f: Folder, index: int, repeat: int, texts: list[str]) -> None:
    log = RequestLog(f.path / f"{index:02d}/repeat-{repeat}" / "requests.jsonl")
    for i, text in enumerate(texts):
        log(Outcome(True, 1.0, len(text.split()), answer=text, category="qa"), Prompt(f"prompt {i}"))
    log.close()


def sweep(tmp: Path, *, temperature: float = 0.0, lines: bool = True, **points: list[str]) -> Folder:
    """The baseline (index 9) and each named point at c=1, one repeat; tok/s rising in the order given."""
    f = Folder(tmp)
    bench = {"temperature": temperature}
    f.run(9, {"algo": "none", "c": 1}, 100.0, base=1, bench=bench)
    if lines:
        write(f, 9, 1, [answer(i) for i in range(PROMPTS)])
    for index, (name, texts) in enumerate(points.items(), 1):
        f.run(index, {"algo": name, "c": 1}, 150.0 + 50 * index, bench=bench)
        if lines:
            write(f, index, 1, texts)
    return f


def rows(f: Folder) -> dict[str, Row]:
    (f.path / "results.jsonl").write_text("".join(f.lines))
    return {r.point.get("algo", ""): r for r in collect.rows_from(collect.read_folders([f.path]))}


def test_a_diverging_and_a_looping_point_are_marked_and_never_best_though_fastest(tmp_path: Path) -> None:
    same = [answer(i) for i in range(PROMPTS)]
    late = [diverging(i, 0.9) if i % 2 else answer(i) for i in range(PROMPTS)]  # batch shapes: late, healthy
    broken = [diverging(i, 0.1) for i in range(PROMPTS)]
    loops = [looping(i) for i in range(PROMPTS)]
    f = sweep(tmp_path, eagle=same, late=late, broken=broken, loops=loops)
    got = rows(f)
    eagle, healthy, bad, looped = (got[k].outputs for k in ("eagle", "late", "broken", "loops"))
    assert eagle is not None and eagle.ran and eagle.match == 1.0 and not eagle.marked
    assert healthy is not None and healthy.match == 0.5 and healthy.prefix_p10 is not None
    assert healthy.prefix_p10 >= 0.85 and not healthy.marked  # a late divergence is no broken verifier
    assert bad is not None and bad.diverged and not bad.degenerate and bad.match == 0.0 and bad.early == 1.0
    assert looped is not None and looped.degenerate and looped.new_loops == PROMPTS
    assert not got["broken"].best and not got["loops"].best  # the fastest two hold no best value
    text = f.report()
    (sentence,) = section(text)
    assert sentence.startswith("At c=1: algo=late is the best"), sentence
    assert "algo=broken c=1 is marked diverged and never named best: 20 of 20 answers leave" in text
    assert "algo=loops c=1 is marked diverged and degenerate and never named best" in text and "inflated" in text
    head = next(ln for ln in text.splitlines() if ln.startswith("POINT"))
    assert head.rstrip().endswith("OUTPUT")
    assert any(re.search(r"  0% p10 0\.\d\d DIVERGED$", ln) for ln in text.splitlines() if "algo=broken" in ln)
    data = json.loads(f.report("json"))
    by = {r["point"]: r["outputs"] for r in data["rows"]}
    assert by["algo=broken c=1"]["diverged"] and by["algo=broken c=1"]["output_match"] == 0.0
    assert by["algo=eagle c=1"]["output_match"] == 1.0 and by["algo=loops c=1"]["degenerate"]
    assert data["decision"]["settings"][0]["best"]["configuration"] == "algo=late"


def test_the_limit_is_the_plans_max_divergence(tmp_path: Path) -> None:
    some = [diverging(i, 0.1) if i < 3 else answer(i) for i in range(PROMPTS)]  # 3 of 20 early: 15 %
    f = sweep(tmp_path, some=some)
    assert rows(f)["some"].outputs.diverged  # type: ignore[union-attr]  # over the default 10 %
    f.lines = [json.dumps({**json.loads(ln), "max_divergence": 0.2}) + "\n" for ln in f.lines]
    assert not rows(f)["some"].outputs.marked  # type: ignore[union-attr]


def test_at_a_temperature_above_0_or_without_request_lines_the_check_says_it_did_not_run(tmp_path: Path) -> None:
    broken = [diverging(i, 0.1) for i in range(PROMPTS)]
    f = sweep(tmp_path / "warm", temperature=0.7, broken=broken)
    check = rows(f)["broken"].outputs
    assert check is not None and not check.ran and not check.marked and "temperature 0.7 > 0" in check.why
    assert "outputs not compared with the baseline's: temperature 0.7 > 0" in f.report()
    old = sweep(tmp_path / "old", lines=False, eagle=[])
    text = old.report()
    assert "outputs not compared with the baseline's: no request lines" in text and "OUTPUT" not in text
    assert json.loads(old.report("json"))["rows"][0]["outputs"]["ran"] is False


def test_without_a_baseline_a_loop_is_still_a_loop_with_a_lower_claim(tmp_path: Path) -> None:
    f = Folder(tmp_path, baseline=False)
    for index, (name, texts) in enumerate((("a", [answer(i) for i in range(PROMPTS)]),
                                           ("b", [looping(i) for i in range(PROMPTS)])), 1):
        f.run(index, {"algo": name, "c": 1}, 100.0 * index, bench={"temperature": 0.0})
        write(f, index, 1, texts)
    got = rows(f)
    b = got["b"].outputs
    assert b is not None and b.degenerate and not b.ran and "lower claim" in b.claim and "no baseline" in b.why
    assert got["a"].outputs is not None and not got["a"].outputs.marked
    (sentence,) = section(f.report())
    assert sentence.startswith("algo=a c=1 is the best"), sentence


def test_the_prefix_is_measured_on_token_ids_where_both_sides_kept_them() -> None:
    base = outputs.Answer("x", 10, "i1", 10, "abcdefghij", list(range(10)), False, 1.0)
    other = outputs.Answer("y", 10, "i2", 10, "abcdefghiZ", [*range(8), 99, 98], False, 1.0)
    assert outputs.compare(other, base) == (False, 0.8)
    same_ids = outputs.Answer("y", 10, "i1", 10, None, None, False, 1.0)  # text differs, ids equal: the ids decide
    assert outputs.compare(same_ids, base) == (True, 1.0)


def test_the_page_shows_the_first_diverging_prompt_beside_the_baselines_answer_escaped(tmp_path: Path) -> None:
    from genready.sweep.report import html as sweephtml
    from genready.sweep.report.main import decision_facts

    hostile = [f"<script>alert({i})</script> " + "x" * 5000 for i in range(PROMPTS)]
    f = sweep(tmp_path, eagle=[answer(i) for i in range(PROMPTS)], broken=hostile)
    (f.path / "results.jsonl").write_text("".join(f.lines))
    read = collect.read_folders([f.path])
    page = sweephtml.render(collect.rows_from(read), facts=decision_facts(read))
    section = page[page.index('<h2 id="outputs">'):]
    assert "algo=broken c=1: diverged" in section and "<script>" not in page
    assert "&lt;script&gt;alert(0)&lt;/script&gt;" in section and answer(0)[:60] in section
    assert "x" * outputs.SHOWN_CHARS not in section  # bounded: the first SHOWN_CHARS characters of each
    assert '<td class="marked">0% p10' in page and "algo=eagle c=1: " not in section


def test_the_plan_key_is_a_fraction_from_0_to_1() -> None:
    plan = 'command = "bench"\nmax_divergence = {v}\n[matrix]\nc = [1]\n'
    assert sweepplan.parse_plan(tomllib.loads(plan.format(v=0.3)), "plan.toml").max_divergence == 0.3
    assert sweepplan.parse_plan(tomllib.loads(plan.replace("max_divergence = {v}\n", "")), "p").max_divergence == 0.1
    with pytest.raises(ConfigError) as e:
        sweepplan.parse_plan(tomllib.loads(plan.format(v=1.5)), "plan.toml")
    assert e.value.key == "max_divergence"


@pytest.mark.system
def test_a_sweep_on_the_simulator_compares_every_point_with_its_baseline(rig: Rig) -> None:
    """The bench client a sweep runs writes {out}/requests.jsonl; the report pairs the points' answers with the
    baseline's (the simulator's greedy answers are the same at every speed: all match) and the results lines carry
    the plan's max_divergence."""
    plan = _speed_plan(rig, {"lat": [0.002], "c": [1]}, baseline={"lat": 0.004}, max_divergence=0.05)
    doc = tomllib.loads(plan.read_text())
    plan.write_text(tomli_w.dumps({**doc, "command": [*doc["command"], "--seed", "7"]}))  # the same prompts
    rc, out = rig.run(plan)
    assert rc == 0, out
    assert all(ln["max_divergence"] == 0.05 for ln in rig.results_lines())
    assert all((rig.results / ln["out"] / "requests.jsonl").is_file() for ln in rig.results_lines())
    table = subprocess.run([*GENREADY, "sweep", "report", str(rig.results)], capture_output=True, text=True,
                           timeout=60, check=True).stdout
    (row,) = [ln for ln in table.splitlines() if ln.startswith("lat=0.002")]
    assert row.endswith("100% p10 1.00"), table


def write_timed(f: Folder, index: int, seconds: list[float]) -> None:
    """Each prompt's baseline answer, taking `seconds[i]`; prompts 0-9 are "short" ones, 10-19 "long" ones."""
    log = RequestLog(f.path / f"{index:02d}/repeat-1" / "requests.jsonl")
    for i, took in enumerate(seconds):
        text = answer(i)
        log(Outcome(True, took, 20 if i < 10 else 600, answer=text, category="short" if i < 10 else "long"),
            Prompt(f"prompt {i}"))
    log.close()


def test_who_gets_slower_per_prompt_with_its_interval_by_category_and_length(tmp_path: Path) -> None:
    """The mean says 1.5x faster; prompt by prompt, the long answers got slower."""
    f = Folder(tmp_path)
    f.run(9, {"algo": "none", "c": 1}, 100.0, base=1, bench={"temperature": 0.0})
    write_timed(f, 9, [1.0] * PROMPTS)
    f.run(1, {"algo": "eagle", "c": 1}, 150.0, bench={"temperature": 0.0})
    write_timed(f, 1, [0.5] * 10 + [1.25] * 8 + [0.9] * 2)
    eagle = rows(f)["eagle"]
    s = eagle.outputs.slower if eagle.outputs else None
    assert s is not None and s.prompts == PROMPTS and s.share == 0.4
    assert 0.2 < s.low < 0.4 < s.high < 0.65  # Wilson's 95 %: 0.22-0.61
    assert s.by_category == {"long": (8, 10), "short": (0, 10)} and s.slowest == "long"
    assert s.by_length == {"<=32 tokens": (0, 10), ">512 tokens": (8, 10)}
    assert len(s.speedups) == PROMPTS and s.speedups[0] == 0.8
    text = f.report()
    (sentence,) = section(text)
    assert "; 40% of prompts slower [22%-61%], slowest category long" in sentence, sentence
    assert "algo=eagle c=1: 40% of prompts slower [22%-61%], slowest category long; by category (slower/prompts): " \
           "long 8/10, short 0/10" in text
    data = json.loads(f.report("json"))
    got = next(r for r in data["rows"] if r["point"] == "algo=eagle c=1")["outputs"]["slower"]
    assert got["share"] == 0.4 and got["by_category"]["long"] == {"slower": 8, "compared": 10}


def test_the_page_draws_who_gets_slower(tmp_path: Path) -> None:
    from genready.sweep.report import html as sweephtml

    f = Folder(tmp_path)
    f.run(9, {"algo": "none", "c": 1}, 100.0, base=1, bench={"temperature": 0.0})
    write_timed(f, 9, [1.0] * PROMPTS)
    f.run(1, {"algo": "eagle", "c": 1}, 150.0, bench={"temperature": 0.0})
    write_timed(f, 1, [0.5] * PROMPTS)
    (f.path / "results.jsonl").write_text("".join(f.lines))
    page = sweephtml.render(collect.rows_from(collect.read_folders([f.path])))
    assert '<div class="plot" id="slower">' in page and "who gets slower" in page
    assert sweephtml.slower_plot(sweephtml.figure_class(), []) is None


def _sim_answers(tmp: Path, name: str, *flags: str) -> dict[str, outputs.Answer]:
    from genready_dev.harness import PY, Simulator, env_without_notify

    sim = Simulator(tmp, "--token-latency", "0.001", *flags)
    try:
        (tmp / name).mkdir()
        env = {k: v for k, v in env_without_notify().items() if not k.startswith("GENREADY_")}
        r = subprocess.run([PY, "-m", "genready.benchclient", "--url", sim.url, "-n", "12", "--max-tokens", "40",
                            "--seed", "3", "--output", str(tmp / name / "bench.jsonl")], env=env, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stderr
    finally:
        sim.stop()
    got = outputs.read_answers([tmp / name])
    assert got
    return got


@pytest.mark.system
def test_the_simulators_broken_arms_are_caught_and_its_healthy_speculation_is_not(tmp_path: Path) -> None:
    """`--output-fault` (genready_dev/simoutput.py) breaks the answers on purpose while the acceptance looks good."""
    base = _sim_answers(tmp_path, "plain")
    healthy = outputs.check(_sim_answers(tmp_path, "spec", "--spec-accept", "3"), base, 0.1)
    diverged = outputs.check(_sim_answers(tmp_path, "diverge", "--spec-accept", "4", "--output-fault", "diverge:5"),
                             base, 0.1)
    looped = outputs.check(_sim_answers(tmp_path, "loop", "--spec-accept", "6", "--output-fault", "loop:10"), base, 0.1)
    late = outputs.check(_sim_answers(tmp_path, "late", "--output-fault", "loop:30"), base, 0.1)
    assert healthy.match == 1.0 and not healthy.marked
    assert diverged.diverged and diverged.match == 0.0 and not diverged.degenerate
    assert looped.degenerate and looped.diverged and "inflated" in looped.claim
    # 10 repeated words at the end of 40 are no loop covering the tail, and a late divergence: no mark
    assert late.match == 0.0 and not late.marked and late.loops == 0
