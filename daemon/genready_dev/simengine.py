"""The simulator's account of what it runs, as each real server gives it (issue 38 §2).

The simulator takes the flags each ServerKind maps to a setting (`EngineRead.flags`), parses them as
its server would (the last of a repeated flag wins; llama-server's --spec-type accumulates), and
reports them the way that server does: SGLang's `GET /server_info` (and the older `/get_server_info`),
vLLM's `non-default args: {...}` line at start and its `*_info` gauges, llama-server's `GET /props`
and the `speculative.*` params of `GET /slots`. `--engine-report KEY=VALUE` makes it report VALUE for
KEY whatever its flags say: an engine that silently runs something else, for the mismatch tests.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Final

from genready.servers import kinds

FLAG_DEST_PREFIX: Final = "engine_flag_"


def _dest(flag: str) -> str:
    return FLAG_DEST_PREFIX + flag.lstrip("-").replace("-", "_")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Every kind's setting flags the simulator does not already have (--model, --parallel are its own)."""
    g = p.add_argument_group("settings the profile's server reports back (GET /server_info, the vLLM start's "
                             "non-default args line, GET /props and /slots)")
    seen = set(p._option_string_actions)  # argparse's own table: a flag the simulator already has stays its
    for k in kinds.KINDS:
        if k.engine is None:
            continue
        for flag in k.engine.flags:
            if flag in seen:
                continue
            seen.add(flag)
            g.add_argument(flag, dest=_dest(flag), metavar="V",
                           action="append" if flag in k.engine.append else "store", help=argparse.SUPPRESS)
    # SGLang's switch (python/sglang/srt/server_args.py): the depth by batch size, simadaptive.py
    g.add_argument("--speculative-adaptive", action="store_true", help=argparse.SUPPRESS)
    g.add_argument("--engine-report", action="append", default=[], metavar="KEY=VALUE",
                   help="report VALUE for the setting KEY whatever the flags say (speculative_num_steps=4, "
                   "speculative_config.num_speculative_tokens=2, total_slots=3): an engine that runs something "
                   "other than its flags")


def _typed(v: str) -> Any:
    """A flag's text as the server's parser types it: ints and floats as numbers, JSON objects as dicts."""
    for conv in (int, float):
        try:
            return conv(v)
        except ValueError:
            pass
    if v.startswith("{"):
        try:
            return json.loads(v)
        except ValueError:
            pass
    return v


def settings(a: argparse.Namespace, kind: kinds.ServerKind) -> dict[str, Any]:
    """key -> value of the settings this simulator's flags set for `kind`, then --engine-report's."""
    read = kind.engine
    out: dict[str, Any] = {}
    if read is None:
        return out
    for flag, key in read.flags.items():
        v = getattr(a, _dest(flag), None)
        if v is None:
            continue
        if isinstance(v, list):  # an accumulating flag, after its default
            out[key] = ",".join([read.append[flag], *v])
        else:
            out[key] = _typed(v)
    for item in a.engine_report:
        key, _, value = item.partition("=")
        if "." in key and key.split(".", 1)[0] in out and isinstance(out[key.split(".", 1)[0]], dict):
            out[key.split(".", 1)[0]][key.split(".", 1)[1]] = _typed(value)
        else:
            out[key] = _typed(value)
    return out


def sglang_server_info(a: argparse.Namespace, spec_accept: float | None) -> dict[str, Any]:
    # python/sglang/srt/entrypoints/http_server.py, server_info: {**dataclasses.asdict(server_args),
    # **scheduler_info, "internal_states": [...], "version"}; the speculative fields are None unless set, and
    # api_key is there as given (the route itself wants the key).
    s = settings(a, kinds.SGLANG)
    args = {"model_path": a.model, "tokenizer_path": a.model, "host": a.host, "port": a.port, "tp_size": 1,
            "dp_size": 1, "api_key": a.api_key, "served_model_name": (a.served_model_name or [a.model])[0],
            "speculative_algorithm": None, "speculative_draft_model_path": None, "speculative_num_steps": None,
            "speculative_eagle_topk": None, "speculative_num_draft_tokens": None, "context_length": None,
            "speculative_adaptive": bool(a.speculative_adaptive), "speculative_adaptive_config": None,
            "max_running_requests": 128, "mem_fraction_static": 0.841, "kv_cache_dtype": "auto",
            "attention_backend": "fa3", "quantization": None}
    args.update(s)
    if args["speculative_algorithm"] == "NEXTN":  # server_args.py _handle_speculative_decoding
        args["speculative_algorithm"] = "EAGLE"
    return {**args, "status": "ready", "max_total_num_tokens": 20480, "max_req_input_len": 20474,
            "internal_states": [{**args, "last_gen_throughput": 0.0, "avg_spec_accept_length": spec_accept}],
            "version": "sim"}


def vllm_args_line(a: argparse.Namespace) -> str:
    # vllm/entrypoints/serve/utils/api_utils.py, log_non_default_args: logger.info("non-default args: %s", d)
    # with the dests that differ from their defaults, api_key masked "***" (newer versions); vLLM's log
    # format: "(APIServer pid=N) INFO MM-DD HH:MM:SS [file:line] message" (vllm/logger.py).
    d: dict[str, Any] = {}
    if a.model != "sim-model":
        d["model"] = a.model
    d.update(settings(a, kinds.VLLM))
    if a.api_key:
        d["api_key"] = "***"
    stamp = time.strftime("%m-%d %H:%M:%S")
    return f"(APIServer pid=0) INFO {stamp} [api_utils.py:273] non-default args: {d!r}"


def log_vllm_args(a: argparse.Namespace) -> None:
    sys.stderr.write(vllm_args_line(a) + "\n")
    sys.stderr.flush()


VLLM_CACHE_INFO: Final = ('# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n'
                          '# TYPE vllm:cache_config_info gauge\n'
                          'vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",'
                          'engine="0",gpu_memory_utilization="0.9"} 1.0')


def llamacpp_props(a: argparse.Namespace, n_ctx: int) -> dict[str, Any]:
    # tools/server/server-context.cpp, get_res_props (build 11434): the params are a default task's, so
    # "speculative.types" says "none" whatever the flags (checked on the real llama-server 11434).
    s = settings(a, kinds.LLAMA_CPP)
    model = s.get("model_path", a.model)
    return {"default_generation_settings": {"params": {"temperature": 0.8, "top_k": 40, "n_predict": -1,
                                                       "speculative.types": "none"},
                                            "n_ctx": n_ctx // max(1, int(s.get("total_slots", a.parallel)))},
            "total_slots": s.get("total_slots", a.parallel), "model_alias": model, "model_ftype": "all F32",
            "model_path": model, "build_info": "b0-sim", "is_sleeping": False}


def llamacpp_slot_params(a: argparse.Namespace) -> dict[str, Any]:
    # tools/server/server-task.cpp, task_params::to_json: a served task's params; its speculative defaults are
    # the server's (params_base.speculative): build 11434 gives "speculative.types" only.
    s = settings(a, kinds.LLAMA_CPP)
    return {"temperature": 0.8, "n_predict": -1, "speculative.types": s.get("speculative.types", "none")}
