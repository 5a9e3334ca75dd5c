"""Prompt categories (issue 37 §2): datasets that carry them, the built-in set, the figures per category, and
the simulator's accept length per category read back by the bench client."""

from __future__ import annotations

import json
import re
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from genready.servers import kinds
from genready.tools import benchclient, prompts
from genready.tools.benchfigures import UNCATEGORISED, AnswerCounts, Outcome, Summary
from genready.tools.prompts import Prompt
from genready_dev import simspec
from genready_dev.harness import PY, Simulator, env_without_notify


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in env_without_notify().items() if not k.startswith("GENREADY_")}
    return subprocess.run([PY, "-m", "genready.benchclient", *args], env=env, capture_output=True, text=True,
                          timeout=120)


def test_jsonl_carries_a_category_and_mt_bench_files_are_read_as_they_are(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    # FastChat's fastchat/llm_judge/data/mt_bench/question.jsonl and Spec-Bench's data/spec_bench/question.jsonl:
    # {"question_id": 81, "category": "writing", "turns": [...]} (MT-bench's math lines add "reference")
    path.write_text('{"prompt": "one", "category": "coding"}\n'
                    '{"messages": [{"role": "user", "content": "two"}], "category": "qa"}\n'
                    '{"prompt": "three"}\n'
                    '{"question_id": 81, "category": "writing", "turns": ["Compose a post.", "Rewrite it."]}\n'
                    '{"question_id": 111, "category": "math", "turns": ["Area?"], "reference": ["3"]}\n')
    assert prompts.load_dataset(path) == [
        Prompt("one", category="coding"), Prompt(messages=(("user", "two"),), category="qa"), Prompt("three"),
        Prompt("Compose a post.", category="writing", later_turns=("Rewrite it.",)),
        Prompt("Area?", category="math")]


@pytest.mark.parametrize(("content", "says"), [
    ('{"prompt": "a"}\n{"prompt": "b", "category": 3}\n', "d.jsonl:2: \"category\": expected text"),
    ('{"prompt": "a", "category": "' + "x" * 65 + '"}\n', "d.jsonl:1: \"category\": expected text of at most 64"),
    ('{"question_id": 1, "category": "writing", "turns": []}\n', "d.jsonl:1: \"turns\": expected a non-empty list"),
    ('{"prompt": "a"}\n\n{"question_id": 2, "turns": ["ok", 7]}\n', "d.jsonl:3: \"turns\": expected a non-empty"),
    ('{"question_id": 2, "turns": "just text"}\n', "d.jsonl:1: \"turns\": expected a non-empty list"),
])
def test_a_malformed_category_or_turns_names_file_and_line(tmp_path: Path, content: str, says: str) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(content)
    with pytest.raises(prompts.DatasetError, match=re.escape(f"{path.parent}/{says}")):
        prompts.load_dataset(path)


def test_the_builtin_set_has_six_categories_of_eight_long_prompts_and_classic_is_kept() -> None:
    by = Counter(p.category for p in prompts.CATEGORIZED)
    assert set(by) >= {"writing", "coding", "math_reasoning", "summarization", "translation", "extraction"}
    assert len(by) >= 6 and min(by.values()) >= 8, by
    assert len({p.text for p in prompts.CATEGORIZED}) == len(prompts.CATEGORIZED)
    assert all("at least 200 words" in p.text for p in prompts.CATEGORIZED)  # answers of >= 128 tokens
    assert next(iter(prompts.PROMPT_SETS)) == "categories"  # the default
    assert prompts.PROMPT_SETS["classic"] is prompts.BUILTIN and len(prompts.BUILTIN) == 32
    args = benchclient.parse_args(["--url", "http://127.0.0.1:1"])
    assert benchclient.prompt_set(args) == list(prompts.CATEGORIZED)
    assert args.prompt_source == f"built-in categories ({len(prompts.CATEGORIZED)} prompts)"
    args = benchclient.parse_args(["--url", "http://127.0.0.1:1", "--prompts", "classic"])
    assert benchclient.prompt_set(args) == list(prompts.BUILTIN)


def _counted(tokens: int, steps: int, category: str, seconds: float = 1.0) -> Outcome:
    spelling = kinds.Spelling("accepted", "drafted", "steps")
    return Outcome(True, seconds, tokens, category=category,
                   counts=AnswerCounts("metrics", spelling, tokens - steps, 4 * steps, steps))


def test_figures_per_category_are_token_weighted_as_the_runs() -> None:
    """Per category, accept length is Σ tokens / Σ verify steps over its answers (never a mean of each answer's):
    code's 10 tokens in 2 steps and 30 in 10 give 40/12 = 3.33, not (5 + 3) / 2."""
    s = Summary(5, 2, outcomes=[_counted(10, 2, "coding"), _counted(30, 10, "coding", 3.0),
                                _counted(20, 10, "writing"), _counted(8, 4, ""),
                                Outcome(False, 0.5, error="HTTP 500", category="writing")])
    got = s.categories()
    assert got is not None and list(got) == [UNCATEGORISED, "coding", "writing"]
    code, writing = got["coding"], got["writing"]
    assert code["accept_length"] == round(1 + 28 / 12, 4) == round(40 / 12, 4)
    assert code["draft_acceptance"] == round(28 / 48, 4)
    assert (code["requests"], code["ok"], code["output_tokens"], code["output_tokens_per_second"]) == (2, 2, 40, 10.0)
    assert (writing["requests"], writing["ok"], writing["accept_length"]) == (2, 1, 2.0)
    assert got[UNCATEGORISED]["accept_length"] == 2.0
    assert s.category_lines()[1] == ("  category   coding: 2 requests, accept length 3.33, draft acceptance 0.583, "
                                     "10.0 output tok/s per request")
    assert Summary(1, 1, outcomes=[_counted(4, 2, "")]).categories() is None  # no category: no figures
    # issue 53 #11: a category name from a prompt file reaches the terminal escaped
    assert Summary(1, 1, outcomes=[_counted(4, 2, "a\x1b[31mb")]).category_lines()[0].startswith(
        "  category   a\\x1b[31mb: 1 requests")


def test_the_simulator_knows_a_builtin_prompts_category() -> None:
    table = simspec.category_table("coding=3.6, writing=1.5")
    assert table == {"coding": 3.6, "writing": 1.5}
    code = next(p for p in prompts.CATEGORIZED if p.category == "coding")
    key = json.dumps([{"role": "user", "content": code.text}], sort_keys=True)  # how the simulator keys a chat
    assert simspec.category_of(key) == "coding" and simspec.accept_for(2.0, table, key) == 3.6
    assert simspec.accept_for(2.0, table, json.dumps("anything else")) == 2.0
    with pytest.raises(ValueError, match="NAME=X"):
        simspec.category_table("coding=0.5")


@pytest.mark.parametrize("api", ["openai-chat", "sglang"])
@pytest.mark.system
def test_per_category_accept_lengths_are_the_simulators(tmp_path: Path, api: str) -> None:
    truth = {"coding": 3.5, "math_reasoning": 3.0, "extraction": 2.5, "summarization": 2.0, "translation": 2.0,
             "writing": 1.5}
    s = Simulator(tmp_path, "--spec-accept", "2.2", "--spec-accept-category",
                  ",".join(f"{k}={v}" for k, v in truth.items()), "--token-latency", "0.0005")
    try:
        out = tmp_path / "a.jsonl"
        r = bench("--url", s.url, "--api", api, "-n", "96", "-c", "8", "--max-tokens", "21", "--seed", "1",
                  "--output", str(out))
    finally:
        s.stop()
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(out.read_text())
    got = res["categories"]
    assert set(got) == set(truth) and sum(c["requests"] for c in got.values()) == 96, got
    # 21 tokens at accept length X take ceil(21 / X) verify steps: the token-weighted figure is 21 / that
    for name, x in truth.items():
        assert got[name]["accept_length"] == pytest.approx(21 / -(-21 // x), abs=1e-4), (name, got[name])
        assert got[name]["requests"] == 16 and got[name]["output_tokens_per_second"] > 0
    order = sorted(got, key=lambda k: got[k]["accept_length"])
    assert order[0] == "writing" and order[-1] == "coding", order
    assert any(line.startswith("  category   coding: 16 requests, accept length ") for line in r.stdout.splitlines())
    assert benchclient.RANDOM_ACCEPT_NOTE not in r.stderr


@pytest.mark.system
def test_random_tokens_on_a_speculative_server_are_said_once_not_to_predict_acceptance(tmp_path: Path) -> None:
    s = Simulator(tmp_path, "--spec-accept", "2.5", "--token-latency", "0.0005")
    try:
        spec = bench("--url", s.url, "--api", "sglang", "-n", "6", "--random-input-len", "20", "--max-tokens", "5")
    finally:
        s.stop()
    (tmp_path / "plain").mkdir()
    plain = Simulator(tmp_path / "plain", "--token-latency", "0.0005")
    try:
        none = bench("--url", plain.url, "--api", "sglang", "-n", "6", "--random-input-len", "20", "--max-tokens", "5")
    finally:
        plain.stop()
    assert spec.returncode == 0 and none.returncode == 0, spec.stderr + none.stderr
    assert spec.stderr.count(benchclient.RANDOM_ACCEPT_NOTE) == 1, spec.stderr
    assert benchclient.RANDOM_ACCEPT_NOTE not in none.stderr
