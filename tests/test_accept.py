"""Acceptance measured two ways and reconciled (issue 38 §4): each server's per-answer spellings, the /metrics
counter deltas, the token-weighted sums, the sources' disagreement, per-position acceptance, and the words
for a speculative server that answers none of the known keys.

In-process: the answers and pages as parsed JSON/text, straight into benchfigures and servermetrics.
System: the bench client against the simulator in each spelling (--sglang-version, vLLM's
--per-request-spec-decode-metrics, --spec-metrics-accept for disagreement).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from genready.apis import BadAnswer
from genready.servers import kinds, metricspage
from genready.tools import servermetrics
from genready.tools.benchfigures import Outcome, Summary, answer_counts
from genready_dev import simspec
from genready_dev.harness import PY, Simulator, env_without_notify

# --- per answer, every spelling ------------------------------------------------------------------------

SGLANG_SPELLINGS = [
    ("0.5.12", {"spec_num_correct_drafts": 6, "spec_num_proposed_drafts": 12, "spec_verify_ct": 4}),
    ("0.5.11", {"spec_accepted_drafts": 6, "spec_proposed_drafts": 12, "spec_verify_ct": 4}),
    ("0.5.10", {"spec_accept_token_num": 6, "spec_draft_token_num": 12, "spec_verify_ct": 4}),
]


@pytest.mark.parametrize(("version", "meta"), SGLANG_SPELLINGS)
@pytest.mark.parametrize("where", ["native", "choice", "sglext"])
def test_every_sglang_spelling_is_read_wherever_it_is(version: str, meta: dict[str, int], where: str) -> None:
    docs: dict[str, dict[str, Any]] = {"native": {"text": "x", "meta_info": meta},
                           "choice": {"choices": [{"text": "x", "meta_info": meta}]},
                           "sglext": {"choices": [{"text": "x"}], "sglext": {"spec_tokens_details": meta}}}
    got = answer_counts(docs[where])
    assert got is not None and (got.accepted, got.drafted, got.steps) == (6, 12, 4), got
    assert got.spelling.versions == {"0.5.12": ">= 0.5.12", "0.5.11": "0.5.11", "0.5.10": "<= 0.5.10"}[version]
    # and the simulator answers that version's spelling
    assert set(simspec.sglang_meta(10, 2.5, simspec.version(version))) >= set(meta)


def test_vllm_and_llamacpp_answers_are_read() -> None:
    vllm = {"choices": [{"text": "x"}], "metrics": {"speculative_decoding": {
        "mean_acceptance_length": 2.5, "num_accepted_draft_tokens": 6, "num_draft_tokens": 12, "num_spec_steps": 4,
        "acceptance_histogram": [0, 2, 2, 0]}}}
    got = answer_counts(vllm)
    assert got is not None and (got.accepted, got.drafted, got.steps, got.histogram) == (6, 12, 4, (0, 2, 2, 0))
    assert answer_counts({"choices": [], "metrics": {"speculative_decoding": None}}) is None  # flag not set: null
    llama = answer_counts({"choices": [], "timings": {"draft_n": 16, "draft_n_accepted": 7}})
    assert llama is not None and (llama.accepted, llama.drafted, llama.steps) == (7, 16, None)
    # a histogram as a map of counts by accepted drafts is the same histogram
    as_map = answer_counts({"metrics": {"speculative_decoding": {"num_accepted_draft_tokens": 6, "num_spec_steps": 4,
                                                                "acceptance_histogram": {"1": 2, "2": 2}}}})
    assert as_map is not None and as_map.histogram == (0, 2, 2)


def test_inconsistent_or_huge_counts_are_no_counts() -> None:
    assert answer_counts({"timings": {"draft_n": 4, "draft_n_accepted": 5}}) is None  # more accepted than drafted
    assert answer_counts({"meta_info": {"spec_num_correct_drafts": True}}) is None
    with pytest.raises(BadAnswer):
        answer_counts({"meta_info": {"spec_num_correct_drafts": 10**400}})


# --- token-weighted ------------------------------------------------------------------------------------

def _outcome(doc: dict[str, Any], tokens: int = 10) -> Outcome:
    return Outcome(True, 0.1, tokens, counts=answer_counts(doc))


def _vllm(accepted: int, steps: int, drafted: int, hist: list[int] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"num_accepted_draft_tokens": accepted, "num_spec_steps": steps, "num_draft_tokens": drafted,
            "mean_acceptance_length": 1 + accepted / steps}
    if hist is not None:
        spec["acceptance_histogram"] = hist
    return {"metrics": {"speculative_decoding": spec}}


def test_the_accept_length_is_token_weighted_not_a_mean_of_means() -> None:
    """A short answer that accepted everything and a long one that accepted little: the mean of their
    mean_acceptance_length is (4 + 1.25) / 2 = 2.625; the run's is 1 + (3 + 25) / (1 + 100) = 1.277."""
    s = Summary(2, 1, outcomes=[_outcome(_vllm(3, 1, 3)), _outcome(_vllm(25, 100, 300))])
    length, source = s.accept()
    assert length == pytest.approx(1 + 28 / 101) and length != pytest.approx((4 + 1.25) / 2)
    assert source == "per answer: metrics.speculative_decoding num_accepted_draft_tokens / num_spec_steps"
    assert s.draft_acceptance() == pytest.approx(28 / 303)
    assert s.acceptance_fields()["accept_missing"] is None


def test_per_position_acceptance_from_the_answers_histograms_and_from_the_counters() -> None:
    """Steps that accepted 0, 1, 2 drafts: position 0 was accepted by the steps with >= 1, position 1 by >= 2."""
    s = Summary(2, 1, outcomes=[_outcome(_vllm(3, 3, 6, [1, 1, 1])), _outcome(_vllm(2, 1, 2, [0, 0, 1]))])
    per_pos, source = s.per_position()
    assert per_pos == [0.75, 0.5] and source == "per answer: metrics.speculative_decoding acceptance_histogram"
    page = ('# TYPE vllm:spec_decode_num_drafts counter\nvllm:spec_decode_num_drafts_total{engine="0"} 8.0\n'
            '# TYPE vllm:spec_decode_num_accepted_tokens counter\n'
            'vllm:spec_decode_num_accepted_tokens_total{engine="0"} 10.0\n'
            '# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 6.0\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",position="0"} 1.0\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="1"} 3.0\n')
    after = metricspage.counters(page)
    run = servermetrics.over_run({k: 0.0 for k in after}, after)
    assert run.accept_per_position == [7 / 8, 3 / 8] and run.accept_length == 1 + 10 / 8
    s = Summary(1, 1, outcomes=[Outcome(True, 0.1, 5)], server_counters=run)
    assert s.per_position() == ([7 / 8, 3 / 8], run.accept_source)


def test_llamacpp_counters_are_matched_with_and_without_total_and_trtllm_gives_a_draft_acceptance() -> None:
    bare = "llamacpp:spec_decode_num_drafts {}\nllamacpp:spec_decode_num_accepted_tokens {}\n"
    # without a TYPE line a sample counts only when named `_total`: typed, the bare names count too
    typed = "".join(f"# TYPE {line.split()[0]} counter\n{line}\n" for line in bare.strip().split("\n"))
    before, after = metricspage.counters(typed.format(10, 20)), metricspage.counters(typed.format(14, 29))
    got = servermetrics.over_run(before, after).acceptance
    assert got is not None and (got.kind, got.accepted, got.steps) == ("llama.cpp", 9, 4)
    trt = ("trtllm_spec_decode_num_draft_tokens_total {}\ntrtllm_spec_decode_num_accepted_tokens_total {}\n")
    before, after = metricspage.counters(trt.format(100, 40)), metricspage.counters(trt.format(200, 70))
    run = servermetrics.over_run(before, after)
    assert run.draft_acceptance == 0.3 and run.accept_length is None
    assert run.draft_acceptance_source == "tensorrt-llm /metrics trtllm_spec_decode_num_accepted_tokens_total / " \
                                          "trtllm_spec_decode_num_draft_tokens_total"


# --- disagreement, vanished fields ---------------------------------------------------------------------

def _counters(drafts: float, accepted: float, draft_tokens: float) -> servermetrics.RunCounters:
    page = ("vllm:spec_decode_num_drafts_total {}\nvllm:spec_decode_num_accepted_tokens_total {}\n"
            "vllm:spec_decode_num_draft_tokens_total {}\n")
    after = metricspage.counters(page.format(drafts, accepted, draft_tokens))
    return servermetrics.over_run({k: 0.0 for k in after}, after)


def test_sources_that_differ_by_more_than_five_percent_are_both_recorded() -> None:
    answers = [_outcome(_vllm(6, 4, 12))]  # 2.5 per answer
    agree = Summary(1, 1, outcomes=answers, server_counters=_counters(4, 6.2, 12))  # 2.55: within 5 %
    assert agree.disagreement() is None
    s = Summary(1, 1, outcomes=answers, server_counters=_counters(4, 8, 12))  # 3.0 from /metrics
    d = s.disagreement()
    assert d is not None and d["accept_length"]["per_answer"] == 2.5 and d["accept_length"]["counters"] == 3.0
    assert d["draft_acceptance"] == {"per_answer": 0.5, "counters": 0.6667, "per_answer_source": (
        "per answer: metrics.speculative_decoding num_accepted_draft_tokens / num_draft_tokens"),
        "counters_source": "vllm /metrics vllm:spec_decode_num_accepted_tokens_total / "
                           "vllm:spec_decode_num_draft_tokens_total"}
    assert any(line.startswith("  accept     DISAGREE accept_length: 2.5 per answer") for line in s.acceptance_lines())


def test_a_speculative_server_answering_none_of_the_keys_is_named_once() -> None:
    """SGLang's verify steps without any of its acceptance spellings (a rename genready does not know yet),
    and vLLM's counters without metrics.speculative_decoding (--per-request-spec-decode-metrics not set)."""
    sglang = Summary(1, 1, outcomes=[Outcome(True, 0.1, 10, spec_verify_ct=4)], kind=kinds.SGLANG)
    words = sglang.acceptance_missing()
    assert words is not None and words.startswith("no per-request acceptance: the server answers none of ")
    assert "spec_num_correct_drafts, spec_accepted_drafts, spec_accept_token_num (SGLang); upgrade, or" in words
    vllm = Summary(1, 1, outcomes=[Outcome(True, 0.1, 10)], metrics_accept=2.5, metrics_kind="vllm")
    words = vllm.acceptance_missing()
    assert words is not None and "metrics.speculative_decoding num_accepted_draft_tokens (vLLM)" in words
    assert words.endswith("start vLLM with --per-request-spec-decode-metrics detailed")
    said = [line for line in vllm.acceptance_lines() if "no per-request acceptance" in line]
    assert said == [f"  accept     {words}"]
    # not speculative, or answering the keys: nothing to say
    assert Summary(1, 1, outcomes=[Outcome(True, 0.1, 10)]).acceptance_missing() is None


# --- against the simulator ---------------------------------------------------------------------------

class Sim(Simulator):
    """`genready simulate` with a 1 ms token latency on a free port, and one bench client run against it."""

    def __init__(self, tmp: Path, *flags: str) -> None:
        super().__init__(tmp, "--token-latency", "0.001", *flags)

    def bench(self, tmp: Path, api: str, *args: str) -> tuple[dict[str, Any], str]:
        out = tmp / f"{api}.jsonl"
        try:
            r = subprocess.run([PY, "-m", "genready.benchclient", "--url", self.url, "--api", api, "-n", "6", "-c", "2",
                                "--max-tokens", "10", "--output", str(out), *args],
                               env=env_without_notify(), capture_output=True, text=True, timeout=60)
        finally:
            self.stop()
        assert r.returncode == 0, r.stdout + r.stderr
        return json.loads(out.read_text()), r.stdout


@pytest.mark.system
@pytest.mark.parametrize(("version", "api", "stream"), [
    ("0.5.12", "sglang", True), ("0.5.11", "sglang", False), ("0.5.10", "sglang", True),
    ("0.5.12", "openai-chat", True), ("0.5.12", "openai-completions", False), ("0.5.10", "openai-chat", False)])
def test_each_sglang_spelling_gives_the_runs_draft_acceptance(tmp_path: Path, version: str, api: str,
                                                                stream: bool) -> None:
    """--spec-accept 2.5, 10 tokens: 4 steps of 3 drafts, 6 accepted per answer, in the version's spelling;
    on the OpenAI routes a choice's meta_info (return_meta_info) or, streamed, sglext (>= 0.5.12)."""
    res, text = Sim(tmp_path, "--spec-accept", "2.5", "--sglang-version", version).bench(
        tmp_path, api, *([] if stream else ["--no-stream"]))
    assert res["accept_length"] == 2.5 and res["draft_acceptance"] == 0.5, res
    assert (res["draft_tokens"], res["draft_accepted"]) == (72, 36), res
    assert res["accept_missing"] is None and res["accept_disagreement"] is None, res
    if version == "0.5.12" and stream:  # the histogram of >= 0.5.12: steps accepting 1 and 2 drafts, 2 each
        assert res["accept_per_position"] == [1.0, 0.5, 0.0], res
        assert "  accept     by position 1.000, 0.500, 0.000" in text


@pytest.mark.system
def test_vllm_per_answer_and_counters_agree_and_give_positions(tmp_path: Path) -> None:
    res, _ = Sim(tmp_path, "--profile", "vllm", "--spec-accept", "2.5", "--per-request-spec-decode-metrics",
                 "detailed").bench(tmp_path, "openai-completions")
    assert res["accept_length"] == 2.5 and res["counters_accept_length"] == 2.5 and res["answers_accept_length"] == 2.5
    assert res["accept_length_source"] == \
        "per answer: metrics.speculative_decoding num_accepted_draft_tokens / num_spec_steps"
    assert res["accept_disagreement"] is None and res["accept_missing"] is None
    assert res["accept_per_position"] == [1.0, 0.5, 0.0]


@pytest.mark.system
def test_vllm_without_per_request_metrics_says_how_to_get_them(tmp_path: Path) -> None:
    res, text = Sim(tmp_path, "--profile", "vllm", "--spec-accept", "2.5").bench(tmp_path, "openai-chat")
    assert res["accept_length"] == 2.5 and res["accept_length_source"] == "/metrics spec_decode counters"
    assert res["accept_per_position"] == [1.0, 0.5, 0.0]  # from vllm:spec_decode_num_accepted_tokens_per_pos
    assert res["accept_missing"] is not None and "--per-request-spec-decode-metrics detailed" in res["accept_missing"]
    assert text.count("no per-request acceptance") == 1, text


@pytest.mark.system
def test_answers_and_counters_that_disagree_are_both_recorded(tmp_path: Path) -> None:
    """The answers at accept length 2.5, /metrics at 5.0 (--spec-metrics-accept): both, in the results line."""
    res, text = Sim(tmp_path, "--profile", "vllm", "--spec-accept", "2.5", "--spec-metrics-accept", "5",
                    "--per-request-spec-decode-metrics", "summary").bench(tmp_path, "openai-completions")
    d = res["accept_disagreement"]
    assert d is not None and d["accept_length"]["per_answer"] == 2.5 and d["accept_length"]["counters"] == 5.0, res
    assert d["draft_acceptance"]["per_answer"] == 0.5 and d["draft_acceptance"]["counters"] == 0.8, res
    assert res["accept_length"] == 2.5  # the run's own answers come first
    assert "  accept     DISAGREE accept_length: 2.5 per answer" in text


def test_tensorrt_llms_iteration_stats_give_an_accept_length_from_the_read_after_the_run_alone() -> None:
    """trtllm-serve's GET /metrics drains its queue (tensorrt_llm/serve/openai_server.py): the read before a run
    empties it, the read after it holds the run's iterations, each with specDecodingStats."""
    page = kinds.TENSORRT_LLM.metrics
    assert not page.cumulative

    def rows(*spec: tuple[int, int, int]) -> bytes:
        return json.dumps([{"iter": j, "specDecodingStats": {"numDraftTokens": d, "numAcceptedTokens": a,
                                                             "numRequestsWithDraftTokens": r}}
                           for j, (d, a, r) in enumerate(spec)] + [{"iter": 99}]).encode()

    before = page.reading(rows((300, 250, 100)))  # iterations before the run: not the run's
    after = page.reading(rows((30, 12, 10), (60, 30, 20)))
    run = servermetrics.over_run(before.values, after.values, cumulative=after.cumulative)
    assert run.accept_length == 2.4 and run.draft_acceptance == round(42 / 90, 4), run
    assert run.accept_source == ("tensorrt-llm /metrics trtllm_spec_decode_num_accepted_tokens_total / "
                                 "trtllm_spec_decode_num_requests_with_draft_tokens_total")
    assert after.values[metricspage.ITERATIONS] == 3
    # what is not its format is refused, never read as counters; odd fields are left out of the sums
    for body in (b"# TYPE x counter\nx_total 1\n", b'{"iter": 1}', b"[1, 2"):
        with pytest.raises(metricspage.NotMetrics):
            page.read(body)
    odd = page.read(b'[{"specDecodingStats": {"numDraftTokens": true, "numAcceptedTokens": 1e400, '
                    b'"numRequestsWithDraftTokens": -3}}]')
    assert odd["trtllm_spec_decode_num_draft_tokens_total"] == 0.0 and all(v == v for v in odd.values())
