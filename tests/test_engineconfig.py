"""The engine confirms what it runs (issue 38 §2): each kind's report parsed from payloads shaped as the real
servers write them, the bounded literal parse of vLLM's log line against hostile input, the comparison with
the ExecStart= flags, and the sweep's decision. In-process; tests/test_engineconfig_servers.py runs them
against the simulator and the real llama-server."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from genready import config
from genready.redact import MASK, redact
from genready.servers import engineconfig as ec
from genready.servers import kinds
from genready.systemd.unitlog import FIRST_LINE_BYTES, OutputMark, head_line
from genready.tools import servercache
from tests.jsonserver import JsonServer, in_turn

# SGLang 2026-02 (docs.sglang.io/basic_usage/native_api.html, GET /server_info of qwen2.5-0.5b), trimmed.
SGLANG_INFO = {
    "model_path": "qwen/qwen2.5-0.5b-instruct", "tokenizer_path": "qwen/qwen2.5-0.5b-instruct", "tp_size": 1,
    "api_key": "sk-secret-1", "admin_api_key": None, "ssl_keyfile_password": None,
    "speculative_algorithm": "EAGLE", "speculative_draft_model_path": "lmsys/eagle", "speculative_num_steps": 3,
    "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4, "cuda_graph_bs": [1, 2, 4],
    "mm_process_config": {}, "status": "ready", "max_total_num_tokens": 20480,
    "internal_states": [{"model_path": "x", "avg_spec_accept_length": 2.5}], "version": "0.5.9"}

# vLLM, log_non_default_args through vllm/logger.py's format (the journal's `-o cat` line, api_key masked
# the way genready's redact masks an older version's list of keys).
VLLM_LINE = ("(APIServer pid=4121) INFO 12-04 14:02:11 [api_utils.py:273] non-default args: {'model_tag': "
             "'meta-llama/Llama-3.1-8B-Instruct', 'host': '127.0.0.1', 'api_key': ['sk-a', 'sk-b'], "
             "'tensor_parallel_size': 2, 'speculative_config': {'method': 'eagle', 'model': 'yuhuili/EAGLE', "
             "'num_speculative_tokens': 3}, 'enable_prefix_caching': True, 'gpu_memory_utilization': 0.85, "
             "'compilation_config': CompilationConfig(level=3, cudagraph_capture_sizes=[1, 2])}")

# llama-server build 11434 (read from the real one: tests/test_engineconfig_servers.py checks it still is).
LLAMA_PROPS = {"default_generation_settings": {"params": {"temperature": 0.8, "speculative.types": "none"},
                                               "n_ctx": 2048},
               "total_slots": 1, "model_alias": "tiny", "model_ftype": "all F32", "model_path": "/m/tiny.gguf",
               "build_info": "b11434-b11434-sdist", "chat_template": "{{x}}" * 2000}
LLAMA_SLOTS = [{"id": 0, "n_ctx": 2048, "speculative": True, "is_processing": False, "id_task": 3,
                "params": {"temperature": 0.8, "speculative.types": "none,draft-simple", "lora": []}}]


# --- each kind's report -------------------------------------------------------------------------------------

def test_sglang_server_info_is_read_flat_without_its_per_rank_states() -> None:
    got = ec.sglang_info("/server_info", json.dumps(SGLANG_INFO).encode())
    assert got["speculative_num_steps"] == 3 and got["speculative_algorithm"] == "EAGLE" and got["tp_size"] == 1
    assert got["cuda_graph_bs"] == "1,2,4" and not any(k.startswith("internal_states") for k in got)
    assert ec.redacted(got)["api_key"] == MASK and ec.redacted(got)["admin_api_key"] is None


def test_vllm_args_line_parses_item_by_item_past_what_is_no_literal() -> None:
    line = redact(VLLM_LINE)  # what the unit's output reader hands over
    assert "sk-a" not in line
    got = ec.vllm_args_line(line)
    assert got["tensor_parallel_size"] == 2 and got["speculative_config.num_speculative_tokens"] == 3
    assert got["speculative_config.method"] == "eagle" and got["enable_prefix_caching"] is True
    assert got["api_key"] == MASK  # the mask is kept as text, not taken for a value
    assert str(got["compilation_config"]).startswith("CompilationConfig(")  # an object's repr, kept as its text


def test_a_vllm_line_cut_short_keeps_its_whole_items_only() -> None:
    got = ec.vllm_args_line(VLLM_LINE[:VLLM_LINE.index("'gpu_memory") + 20] + " [...]")
    assert got["enable_prefix_caching"] is True and "gpu_memory_utilization" not in got


def test_llamacpp_props_and_slots() -> None:
    props = ec.llamacpp_props("/props", json.dumps(LLAMA_PROPS).encode())
    assert props == {"model_path": "/m/tiny.gguf", "total_slots": 1, "model_alias": "tiny",
                     "build_info": "b11434-b11434-sdist", "n_ctx_slot": 2048}  # its params' speculative.* lie
    slots = ec.llamacpp_slots("/slots", json.dumps(LLAMA_SLOTS).encode())
    assert slots == {"speculative": True, "speculative.types": "none,draft-simple"}
    old = [{"id": 0, "speculative": True, "params": {"speculative.n_max": 16, "speculative.n_min": 0,
                                                     "speculative.p_min": 0.75}}]
    assert ec.llamacpp_slots("/slots", json.dumps(old).encode())["speculative.n_max"] == 16


def test_metrics_info_gauges_become_labelled_keys() -> None:
    page = ('# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size="16",cache_dtype="auto",'
            'engine="0"} 1.0\nvllm:num_requests_running{engine="0"} 0.0\n'
            'trtllm_speculative_config_info{decoding_type="Eagle",max_draft_len="3"} 1.0\n')
    got = ec.metrics_info(page)
    assert got == {"vllm:cache_config_info.block_size": "16", "vllm:cache_config_info.cache_dtype": "auto",
                   "vllm:cache_config_info.engine": "0", "trtllm_speculative_config_info.decoding_type": "Eagle",
                   "trtllm_speculative_config_info.max_draft_len": "3"}


# --- the literal parse's bounds -------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "{'a': " * 100 + "1" + "}" * 100,  # deep
    "[" * 50_000,  # deeper than the parser itself allows
    "{" + ", ".join(f"'k{i}': [1, 2, 3]" for i in range(8000)) + "}",  # too many nodes, too long
    "{'a': __import__('os').system('true')}",  # code, not a literal
    "{'a': (lambda: 1)()}",
    "{'a': " + "9" * 5000 + "}",  # an int past Python's digit limit
    "'" + "x" * (ec.MAX_LITERAL + 1) + "'",
])
def test_the_literal_parse_refuses_what_is_not_a_small_literal(text: str) -> None:
    t0 = time.monotonic()
    with pytest.raises(ec.NotLiteral):
        ec.literal(text)
    assert time.monotonic() - t0 < 2.0


def test_the_dict_parse_of_hostile_lines_is_bounded_and_runs_nothing(tmp_path: Path) -> None:
    flag = tmp_path / "ran"
    hostile = [
        "{'a': __import__('pathlib').Path(" + repr(str(flag)) + ").touch(), 'b': 2}",
        "{'a': " + "[" * 10_000 + "}",
        "{" + "'k': 1, " * 100_000 + "}",
        "{'a': '" + "\\" * 70_000,
        "not a dict at all",
    ]
    for text in hostile:
        t0 = time.monotonic()
        try:
            got = ec.dict_repr(text)
        except ec.NotLiteral:
            got = {}
        assert time.monotonic() - t0 < 2.0 and len(got) <= ec.MAX_KEYS
    assert not flag.exists()
    assert ec.dict_repr(hostile[0])["b"] == 2  # the one harmless item survives, the call stays text


# --- flags against the report ---------------------------------------------------------------------------

def test_expected_values_follow_the_servers_own_parsing() -> None:
    read = kinds.SGLANG.engine
    assert read is not None
    argv = ["--model-path", "m", "--speculative-num-steps", "3", "--speculative-num-steps=5", "--tp", "2"]
    assert ec.expected(read, argv) == {"model_path": ("--model-path", "m"), "speculative_num_steps":
                                       ("--speculative-num-steps", "5"), "tp_size": ("--tp", "2")}
    vllm = kinds.VLLM.engine
    assert vllm is not None
    got = ec.expected(vllm, ["Qwen/Q", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4}'])
    assert got == {"model_tag": ("(positional)", "Qwen/Q"), "speculative_config.method": ("--speculative-config",
                   "ngram"), "speculative_config.num_speculative_tokens": ("--speculative-config", "4")}
    llama = kinds.LLAMA_CPP.engine
    assert llama is not None
    got = ec.expected(llama, ["-m", "a.gguf", "--spec-type", "draft-simple", "--spec-draft-n-max", "4"])
    assert got["speculative.types"] == ("--spec-type", "none,draft-simple")


def test_a_mismatch_is_named_and_an_unreported_value_is_unconfirmed() -> None:
    read = kinds.SGLANG.engine
    assert read is not None
    reported = ec.sglang_info("/server_info", json.dumps(SGLANG_INFO).encode())
    want = ec.expected(read, ["--model-path", "qwen/qwen2.5-0.5b-instruct", "--speculative-algorithm", "NEXTN",
                              "--speculative-num-steps", "5", "--speculative-eagle-topk", "1",
                              "--kv-cache-dtype", "fp8_e5m2"])
    conf = ec.compare(read, want, reported)
    assert [(m.flag, m.expected, m.reported) for m in conf.mismatches] == [("--speculative-num-steps", "5", 3)]
    assert conf.unconfirmed == (("--kv-cache-dtype", "kv_cache_dtype", "fp8_e5m2"),)
    assert set(conf.confirmed) == {"model_path", "speculative_algorithm", "speculative_eagle_topk"}  # NEXTN=EAGLE
    v = ec.verdict(conf)
    assert v.status == ec.CONFIG_MISMATCH and "--speculative-num-steps 5" in v.reason and "reports" in v.reason
    assert v.warnings and "--kv-cache-dtype fp8_e5m2" in v.warnings[0]
    assert json.loads(json.dumps(conf.to_json()))["mismatches"][0]["reported"] == 3


def test_the_plans_expect_checks_engine_keys_and_an_unreported_one_fails() -> None:
    reported = {"speculative_num_steps": 3, "speculative_eagle_topk": 1}
    conf = ec.with_expect(ec.Confirmation(), {"speculative_num_steps": "3", "speculative_eagle_topk": "4",
                                              "speculative_num_stepz": "3"}, reported)
    assert [(m.key, m.reported) for m in conf.mismatches] == [("speculative_eagle_topk", 1),
                                                             ("speculative_num_stepz", None)]
    assert ec.verdict(conf).status == ec.CONFIG_MISMATCH
    ok = ec.with_expect(ec.Confirmation(), {"speculative_num_steps": "3"}, reported)
    assert ec.verdict(ok) == ec.Verdict(None)


def test_values_compare_as_the_same_setting() -> None:
    assert ec.same_value("3", 3) and ec.same_value("0.75", 0.75) and ec.same_value("true", True)
    assert not ec.same_value("3", 4) and not ec.same_value("EAGLE", "eagle") and not ec.same_value("x", None)


def test_a_value_beyond_a_float_is_a_mismatch_not_a_crash() -> None:
    # issue 53 #10: an engine reporting `1` and 400 zeros raised OverflowError out of the sweep
    huge = int("1" + "0" * 400)
    assert not ec.same_value("3", huge) and ec.same_value(str(huge), huge)
    conf = ec.with_expect(ec.Confirmation(), {"speculative_num_steps": "3"}, {"speculative_num_steps": huge})
    assert ec.verdict(conf).status == ec.CONFIG_MISMATCH
    assert ec.differing_keys([{"k": huge}, {"k": 1}]) == ["k"]


def test_no_drafting_differing_keys_and_identical_configs() -> None:
    assert ec.speculative({"speculative_algorithm": "EAGLE"}) and ec.speculative({"speculative": True})
    assert ec.speculative({"speculative_config.method": "ngram"}) and not ec.speculative({"tp_size": 1})
    assert ec.drafting_verdict(True, 0).status == ec.NO_DRAFTING
    assert ec.drafting_verdict(True, None).status is None and ec.drafting_verdict(False, 0).status is None
    assert ec.differing_keys([{"a": 1, "b": 2}, {"a": 1, "b": 3}, {"a": 1}]) == ["b"]
    warn = ec.identical_configs([("p1", {"steps": 3}, {"k": 1}), ("p2", {"steps": 5}, {"k": 1}),
                                 ("p3", {"steps": 5}, {"k": 2})])
    assert len(warn) == 1 and warn[0].startswith("p1 and p2")


def test_the_kind_of_an_execstart_argv() -> None:
    found = kinds.serving(["/usr/bin/python3", "-m", "sglang.launch_server", "--model-path", "m"])
    assert found is not None and found[0] is kinds.SGLANG and found[1] == ["--model-path", "m"]
    found = kinds.serving(["/x/genready", "simulate", "--profile", "llamacpp", "--port", "1"])
    assert found is not None and found[0] is kinds.LLAMA_CPP
    assert kinds.serving(["/bin/sleep", "1"]) is None and kinds.serving([]) is None


# --- reading, through a Call that stands in for HTTP (the bounds are the caller's: servercache) -----------

def test_read_engine_asks_the_newer_route_then_the_older_one() -> None:
    asked: list[str] = []

    async def call(method: str, path: str, body: Any = None, timeout: float | None = None) -> tuple[int, bytes]:
        asked.append(path)
        if path == "/get_server_info":
            return 200, json.dumps(SGLANG_INFO).encode()
        return 404, b'{"detail":"Not Found"}'
    read = kinds.SGLANG.engine
    assert read is not None
    got = asyncio.run(ec.read_engine(read, call))
    assert asked == ["/server_info", "/get_server_info"] and got.sources == ["GET /get_server_info"]
    assert got.problems == [] and got.to_json()["values"]["api_key"] == MASK


def test_read_engine_says_what_it_could_not_read() -> None:
    async def call(method: str, path: str, body: Any = None, timeout: float | None = None) -> tuple[int, bytes]:
        return 401, b'{"error":"Unauthorized"}'
    read = kinds.VLLM.engine
    assert read is not None
    got = asyncio.run(ec.read_engine(read, call, None))
    assert got.values == {} and any("non-default args" in p for p in got.problems)


# --- the start's args line, from the unit's output ------------------------------------------------------------

def test_the_first_args_line_since_the_mark_is_found_and_masked(tmp_path: Path) -> None:
    out = tmp_path / "out.log"
    out.write_text("(old start) non-default args: {'model_tag': 'old'}\n")
    mark = OutputMark(time.time(), {out: out.stat().st_size})
    filler = "x" * 200 + "\n"
    with out.open("a") as f:
        f.write(filler * 2000 + VLLM_LINE + "\n" + filler * 10)
    line = mark.first_line("user", "u.service", ec.ARGS_MARK, secrets=["sk-b"])
    assert line is not None and "'model_tag': 'meta-llama" in line and "sk-a" not in line and "sk-b" not in line


def test_a_huge_args_line_is_cut_and_a_missing_one_is_none(tmp_path: Path) -> None:
    out = tmp_path / "out.log"
    out.write_text("non-default args: {'a': '" + "y" * (FIRST_LINE_BYTES * 3) + "'}\n")
    fd = os.open(out, os.O_RDONLY)
    try:
        line = head_line(fd, 0, ec.ARGS_MARK.encode())
        assert line is not None and len(line) <= FIRST_LINE_BYTES + 10 and line.endswith("[...]")
        assert head_line(fd, 0, b"no such marker") is None
    finally:
        os.close(fd)


def test_a_transient_refusal_is_asked_again_not_taken_for_the_engines_report() -> None:
    """Issue 53 #9: one 503 from /server_info made every point of the loaded configuration config_mismatch
    ("reports KEY=None"). A route that answers 503 (or 429, 502, 504, nothing) is asked again after a pause; a
    refusal that lasts past RETRY_PAUSES is still a problem, said as before. (A loopback server in a thread.)"""
    info = {"speculative_num_steps": 3, "model_path": "/m"}
    server = JsonServer(lambda path: in_turn(server, [(503, {"error": "busy"}), (200, info)]))
    try:
        target = config.parse({"targets": {"t": {"unit": "u.service", "url": server.base}}}, service=False)
        http = servercache.ServerHttp(target.targets["t"])
        read = kinds.SGLANG.engine
        assert read is not None
        got = servercache.engine_config(http, read)
        assert got.values["speculative_num_steps"] == 3 and got.sources == ["GET /server_info"], got
        assert server.asked == ["/server_info", "/server_info"]
        server.answer = lambda path: (503, {"error": "busy"})
        got = servercache.engine_config(http, read)
        assert not got.sources and "/server_info 503" in got.problems[0], got
        # each route asked once and again after every pause
        assert server.asked[2:] == ["/server_info"] * (1 + len(ec.RETRY_PAUSES)) + \
            ["/get_server_info"] * (1 + len(ec.RETRY_PAUSES))
    finally:
        server.close()
