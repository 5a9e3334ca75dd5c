"""The bench client's request lines (issue 50 §1): one line per request beside its result line, against a real
simulator process; and the degenerate-output figures each line carries (tools/textloops.py)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from genready.servers import kinds
from genready.tools import answerfacts, textloops
from genready.tools import requestline as rl
from genready.tools.benchfigures import Outcome
from genready.tools.prompts import Prompt
from genready.tools.requestlog import RequestLog
from genready_dev.harness import PY, Simulator, env_without_notify


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Simulator]:
    s = Simulator(tmp_path_factory.mktemp("sim"), "--token-latency", "0.001")
    yield s
    s.stop()


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in env_without_notify().items() if not k.startswith("GENREADY_")}
    return subprocess.run([PY, "-m", "genready.benchclient", *args], env=env, capture_output=True, text=True,
                          timeout=60)


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.mark.system
@pytest.mark.parametrize(("api", "stream"), [("sglang", True), ("sglang", False), ("openai-completions", True),
                                             ("openai-completions", False)])
def test_every_request_has_its_line_beside_the_result_line(sim: Simulator, tmp_path: Path, api: str,
                                                           stream: bool) -> None:
    out = tmp_path / "bench.jsonl"
    r = bench("--url", sim.url, "--api", api, "-n", "10", "-c", "2", "--max-tokens", "6", "--seed", "3",
              "--output", str(out), *([] if stream else ["--no-stream"]))
    assert r.returncode == 0, r.stderr
    got = lines(tmp_path / rl.REQUESTS_FILE)
    assert len(got) == 10 == json.loads(out.read_text())["request_lines"]
    assert all(set(g) == {f.key for f in rl.FIELDS} for g in got)
    for g in got:
        assert g["ok"] and g["output_tokens"] == 6 and g["finish_reason"] == "length", g
        assert g["e2e_ms"] > 0 and g["input_tokens"] is not None and g["category"]
        assert (g["ttft_ms"] is not None) is stream
        assert g["text_chars"] > 0 and len(g["text_sha256"]) == 64
    # the first answer of each prompt keeps its text (and its ids, where the server gave them); repeats: digests
    firsts = {}
    for g in got:
        if g["prompt_id"] not in firsts:
            firsts[g["prompt_id"]] = g
            assert g["text"] is not None and rl.digest(g["text"]) == g["text_sha256"]
        else:
            assert g["text"] is None and g["text_sha256"] == firsts[g["prompt_id"]]["text_sha256"]
    # SGLang's own /generate returns output_ids unasked (servers/kinds.py, TokenIds); the simulator's OpenAI routes
    # are SGLang's, whose answers carry none
    with_ids = [g for g in got if g["token_count"] is not None]
    assert (len(with_ids) == 10) is (api == "sglang"), with_ids
    assert all(g["token_count"] == 6 and len(g["token_ids_sha256"]) == 64 for g in with_ids)
    assert all(g["token_ids"] is not None for g in firsts.values() if api == "sglang")


@pytest.mark.system
def test_the_same_prompts_have_the_same_ids_in_every_run_and_no_lines_when_asked_not_to(
        sim: Simulator, tmp_path: Path) -> None:
    runs = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        r = bench("--url", sim.url, "-n", "8", "--max-tokens", "3", "--seed", "5",
                  "--output", str(tmp_path / name / "bench.jsonl"))
        assert r.returncode == 0, r.stderr
        # lines in the order the answers came (4 in flight): the same prompts, in some order
        runs.append(sorted((g["prompt_id"], g["category"]) for g in lines(tmp_path / name / rl.REQUESTS_FILE)))
    assert runs[0] == runs[1] and len(set(runs[0])) > 1
    (tmp_path / "c").mkdir()
    r = bench("--url", sim.url, "-n", "2", "--output", str(tmp_path / "c" / "bench.jsonl"), "--no-requests-output")
    assert r.returncode == 0 and not (tmp_path / "c" / rl.REQUESTS_FILE).exists()
    elsewhere = tmp_path / "mine.jsonl"
    r = bench("--url", sim.url, "-n", "2", "--requests-output", str(elsewhere))
    assert r.returncode == 0 and len(lines(elsewhere)) == 2


def test_a_prompt_id_is_the_prompts_and_its_turns_digest() -> None:
    a = rl.prompt_id("hi", (), (), 0)
    assert a == rl.prompt_id("hi", (), (), 0) and len(a) == 16
    assert len({a, rl.prompt_id("hi", (), (), 1), rl.prompt_id("", (("user", "hi"),), (), 0),
                rl.prompt_id("", (), (1, 2), 0)}) == 4


def test_texts_are_kept_bounded_and_cut_at_a_character(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    log = RequestLog(path)
    long = "é" * (rl.TEXT_BYTES)  # two bytes each: the cut falls inside none
    log(Outcome(True, 0.5, 3, answer=long, token_ids=tuple(range(rl.MAX_TOKEN_IDS + 5))), Prompt("p"))
    log(Outcome(False, 0.1, error="x" * 1000), Prompt("q"))
    log.close()
    first, failed = lines(path)
    assert first["text"] == "é" * (rl.TEXT_BYTES // 2) and first["text_chars"] == rl.TEXT_BYTES
    assert first["text_sha256"] == rl.digest(long) and len(first["token_ids"]) == rl.MAX_TOKEN_IDS
    assert first["token_count"] == rl.MAX_TOKEN_IDS + 5
    assert failed["ok"] is False and len(failed["error"]) == rl.ERROR_CHARS and failed["text"] is None


def test_a_torn_last_line_is_ended_before_the_next_run_appends(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text('{"prompt_id": "torn')
    log = RequestLog(path)
    log(Outcome(True, 0.5, 1, answer="a"), Prompt("p"))
    log.close()
    assert json.loads(path.read_text().splitlines()[1])["text"] == "a"


def test_a_loop_at_the_tail_is_found_and_varied_text_is_none() -> None:
    prose = textloops.words_of("Speculative decoding drafts several tokens with a small model and has the large "
                               "model verify them in one step, so the output is the large model's own while the "
                               "steps are fewer when drafts are accepted often enough to pay for the drafting")
    assert textloops.tail_loop(prose) is None
    looped = prose[:20] + ["and", "then", "we", "go"] * 12
    assert textloops.tail_loop(looped) == 4
    assert textloops.tail_loop(prose[:20] + ["again"] * 30) == 1
    assert textloops.tail_loop(["ok"] * 10) is None  # too short to judge
    varied, looping = textloops.unique_bigrams(prose), textloops.unique_bigrams(looped)
    assert varied is not None and looping is not None and varied > 0.95 > 0.6 > looping
    assert textloops.unique_bigrams(["one"]) is None


def test_token_ids_are_read_where_each_kind_says() -> None:
    """vLLM's chunks carry the new ids (return_token_ids), SGLang's own stream the ids so far; llama.cpp's OpenAI
    routes none (servers/kinds.py)."""
    vllm, sglang = kinds.VLLM.token_ids, kinds.SGLANG.token_ids
    assert vllm is not None and vllm.ask == {"return_token_ids": True} and kinds.LLAMA_CPP.token_ids is None
    got: list[int] | None = None
    chunks: list[dict[str, Any]] = [{"choices": [{"token_ids": [5, 6]}]}, {"choices": [{"token_ids": [7]}]},
                                    {"usage": {}}]
    for chunk in chunks:
        got = answerfacts.token_ids(vllm, chunk, got)
    assert got == [5, 6, 7]
    got = None
    for event in ({"output_ids": [5]}, {"output_ids": [5, 6]}, {"output_ids": [5, 6, 7]}):
        got = answerfacts.token_ids(sglang, event, got)
    assert got == [5, 6, 7]
    assert answerfacts.token_ids(sglang, {"output_ids": [1, True]}) is None
    assert answerfacts.finish_reason({"meta_info": {"finish_reason": {"type": "stop"}}}) == "stop"
    assert answerfacts.finish_reason({"choices": [{"finish_reason": None}]}, "length") == "length"
    assert answerfacts.input_tokens({"usage": {"prompt_tokens": 9}}) == 9
