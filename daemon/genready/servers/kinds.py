"""The LLM servers genready knows, one ServerKind each: everything that differs between them.

Every other module asks a kind (or walks KINDS) instead of comparing a server's name: `init`'s
command-line reading (tools/unitinit.py), the flush between a sweep's runs (tools/servercache.py),
the /metrics counters (tools/servermetrics.py), the bench client's per-answer fields and its
connection handling (tools/bench*.py), the probe's words for a server's refusals (probe/probe.py)
and the simulator's profiles (genready_dev/simprofiles.py). Adding a server is one more ServerKind here,
plus its simulator profile (docs/architecture.md, "Adding a server kind").

Each fact names the server's source file it was read from.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from genready.apis import MODELS_PATH, too_large
from genready.servers.acceptance import AcceptanceRecord
from genready.servers.engineconfig import (
    ARGS_MARK,
    EngineRead,
    llamacpp_props,
    llamacpp_slots,
    sglang_info,
    vllm_args_line,
)
from genready.servers.flush import Call, Flush, Flushed, flush_llamacpp, flush_sglang, flush_vllm
from genready.servers.metricspage import (
    ITERATION_STATS,
    POSITION_LABEL,
    PROMETHEUS,
    MetricsPage,
    NotMetrics,
    Reading,
)
from genready.servers.schedules import ADAPTIVE, PER_BATCH_SIZE, ScheduleFormat


def total(name: str) -> str:
    """A counter's sample name on a /metrics page: prometheus_client (and llama.cpp) add `_total`."""
    return name if name.endswith("_total") else name + "_total"


@dataclass(frozen=True)
class HitRate:
    """The prefix cache's counters (names without `_total`), in tokens."""

    hits: str
    total: str
    total_excludes_hits: bool = False  # llama.cpp's prompt_tokens leave the cached ones out


@dataclass(frozen=True)
class SpecMetrics:
    """Speculative decoding's counters (names without `_total`): 1 + Δaccepted / Δsteps is the accept length."""

    accepted: str
    steps: str  # verify steps (vLLM: drafts)
    draft_tokens: str = ""  # draft tokens proposed, where counted
    source: str = ""  # the bench client's accept_length_source for a length from them
    per_pos: str = ""  # accepted draft tokens by draft position, one sample per value of its `position` label


@dataclass(frozen=True)
class Spelling:
    """One version's names for an answer's speculative-decoding counts (absent: "")."""

    accepted: str  # draft tokens the target model accepted
    drafted: str = ""  # draft tokens proposed
    steps: str = ""  # verify steps of the target model
    histogram: str = ""  # steps by how many drafts each accepted: [steps with 0, with 1, ...]
    versions: str = ""  # the server versions that answer so, for people


@dataclass(frozen=True)
class TokenIds:
    """How to ask a server for an answer's output token ids, and where the answer carries them (the request lines'
    token_ids, tools/requestlog.py): `ask` is added to a request on the `api` it names ("": its OpenAI routes),
    `path` is where the list is (a number indexes a list). `cumulative`: each stream event carries the ids so far
    (SGLang's native stream without --stream-output), else each carries the new ones (vLLM's deltas)."""

    path: tuple[str | int, ...]
    ask: Mapping[str, Any] = field(default_factory=dict)
    api: str = ""
    cumulative: bool = False


@dataclass(frozen=True)
class AnswerSpec:
    """Where an answer carries its own speculative-decoding counts: the objects to look in (paths of keys
    from the parsed answer, a number indexes a list) and each known spelling, newest first."""

    paths: tuple[tuple[str | int, ...], ...]
    spellings: tuple[Spelling, ...]
    fix: str = ""  # what makes a speculative server answer them, when it does not

    def names(self) -> tuple[str, ...]:
        """Every accepted-count key, for the words of a server that answers none of them."""
        return tuple(s.accepted for s in self.spellings)


@dataclass(frozen=True)
class ServerKind:
    """One server: how `init` recognises it, its routes, its flush, its counters and its quirks."""

    name: str  # the word in results and in a target's `kind`
    label: str  # for people
    api: str  # the api `init` proposes
    sim_profile: str = ""  # genready's simulator imitates it: `genready simulate --profile NAME` ("": it does not)
    native_api: str = ""  # the api (apis.APIS) that is this server's own wire format, not the OpenAI routes
    # -- how init recognises it: `python -m MODULE`, `PROGRAM serve` (or `python -m PROGRAM serve`), a program,
    #    or a container image whose entrypoint is the server
    modules: tuple[str, ...] = ()
    serve_programs: tuple[str, ...] = ()
    programs: tuple[str, ...] = ()
    images: tuple[str, ...] = ()
    entrypoint: tuple[str, ...] = ()
    host: str | None = "127.0.0.1"  # default listen address; None: every interface
    port: int = 8000
    flags: Mapping[str, str] = field(default_factory=dict)  # command-line flag -> what it sets (host, port, key, …)
    env: Mapping[str, str] = field(default_factory=dict)  # variable -> what it sets
    key_fix: str = ""  # how to hand this server its key without exposing it
    model_is_weights: bool = False  # /v1/models names the weights when no served name is given
    init_notes: Mapping[str, str] = field(default_factory=dict)  # what init adds, by situation ("uds")
    # -- routes
    health_route: str = "/health"  # "" : it has none (its GET /health answers 404)
    models_route: str = MODELS_PATH
    info_routes: tuple[str, ...] = ()  # server info with an average accept length, in the order to ask (SGLang)
    info_accept: Callable[[bytes], float | None] | None = None  # that average from an info route's body
    info_source: str = ""  # where that average comes from, for a results line
    # -- the prefix cache's flush
    flush: Flush | None = None
    flush_needs: str = ""  # the words for what the flush needs
    # -- its counter page and per-answer figures
    metrics: MetricsPage = PROMETHEUS
    metrics_needs: str = ""  # what makes it serve that page, in words, when it does not by default
    hit_rate: HitRate | None = None
    spec: SpecMetrics | None = None
    verify_field: str = ""  # meta_info's verify-step count in an answer (SGLang)
    verify_sources: tuple[str, str] = ("", "")  # where an accept length from it comes from: (own API, OpenAI routes)
    # extra fields of a request on its OpenAI routes that make the answer carry its acceptance counts:
    # (a whole answer, a stream)
    openai_fields: tuple[Mapping[str, Any], Mapping[str, Any]] = ({}, {})
    draft_fields: tuple[str, str] | None = None  # timings' (drafted, accepted) in an answer (llama.cpp)
    answer_spec: AnswerSpec | None = None  # an answer's own speculative-decoding counts, every spelling
    token_ids: TokenIds | None = None  # how to get an answer's output token ids (None: its answers carry none)
    # -- connection quirks
    server_header: str = ""  # its Server header's product, before the "/"
    closes_after_stream: bool = False  # closes the connection after a streamed answer despite keep-alive
    refusal_words: Mapping[str, str] = field(default_factory=dict)  # a refusal's text (lowercase) -> the fix
    # -- what it says it runs (servers/engineconfig.py), and which flags set which of its keys
    engine: EngineRead | None = None
    # -- how it takes a speculation depth per batch size (servers/schedules.py; sweep report --schedule)
    schedule: ScheduleFormat | None = None

    def acceptance(self, deltas: Mapping[str, float]) -> AcceptanceRecord | None:
        """Its counter page's adapter: a run's deltas of its speculative-decoding counters as one neutral record;
        None when they did not grow (or it counts none)."""
        m = self.spec
        accepted = counter(deltas, m.accepted) if m is not None else None
        if m is None or accepted is None:
            return None
        steps = counter(deltas, m.steps) if m.steps else None
        drafted = counter(deltas, m.draft_tokens) if m.draft_tokens else None
        if not steps and not drafted:
            return None
        where = f"{self.name} {self.metrics.route} {total(m.accepted)}"
        return AcceptanceRecord(self.name, accepted, steps or None, drafted,
                                tuple(positions(deltas, m.per_pos)) if m.per_pos else (),
                                steps_source=f"{where} / {total(m.steps)}" if m.steps else "",
                                drafted_source=f"{where} / {total(m.draft_tokens)}" if m.draft_tokens else "",
                                label=m.source)

    def info_acceptance(self, body: bytes) -> AcceptanceRecord | None:
        """Its info route's adapter: the engine's own average accept length as a record (None: not there)."""
        average = self.info_accept(body) if self.info_accept is not None else None
        return None if average is None else AcceptanceRecord(self.name, average=average,
                                                              steps_source=self.info_source, label=self.info_source)


# --- the kinds -------------------------------------------------------------------------------------------

SGLANG: Final = ServerKind(
    "sglang", "SGLang", "sglang", sim_profile="sglang", native_api="sglang",
    # python/sglang/srt/server_args.py
    modules=("sglang.launch_server",), serve_programs=("sglang",), host="127.0.0.1", port=30000,
    flags={"--host": "host", "--port": "port", "--api-key": "key", "--served-model-name": "model",
           "--model-path": "weights", "--model": "weights", "--ssl-keyfile": "tls", "--ssl-certfile": "tls",
           "--fastapi-root-path": "prefix"},
    key_fix="SGLang takes its key only as --api-key: keep it in a file (LoadCredential=apikey:FILE) and start "
            "SGLang from a small Python wrapper that reads $CREDENTIALS_DIRECTORY/apikey and launches the server "
            "in-process, so the key never reaches a command line",
    # python/sglang/srt/entrypoints/http_server.py: /get_server_info; newer versions serve /server_info and
    # answer /get_server_info with a deprecation warning in the server's log (docs.sglang.io, native_api)
    info_routes=("/server_info", "/get_server_info"), info_accept=lambda body: sglang_accept(body),
    info_source="get_server_info avg_spec_accept_length (SGLang's recent average, not this run's alone)",
    flush=flush_sglang, flush_needs="SGLang /flush_cache",
    # python/sglang/srt/metrics/collector.py
    hit_rate=HitRate("sglang:cached_tokens", "sglang:prompt_tokens"),
    # python/sglang/srt/managers/tokenizer_manager.py: set only when a speculative algorithm runs
    verify_field="spec_verify_ct",
    verify_sources=("meta_info.spec_verify_ct", "meta_info.spec_verify_ct (return_meta_info)"),
    # its OpenAI routes: return_meta_info puts a choice's meta_info (with spec_verify_ct) into a whole answer;
    # a stream has none, return_spec_tokens_details puts sglext.spec_tokens_details into its last event
    openai_fields=({"return_meta_info": True}, {"return_spec_tokens_details": True}),
    # Renamed twice (verl read 0 for weeks after a rename, verl PR #7543). The native API's meta_info, a
    # choice's meta_info on the OpenAI routes (return_meta_info, not on a stream), and sglext.spec_tokens_details
    # there (return_spec_tokens_details; python/sglang/srt/entrypoints/openai/utils.py,
    # spec_tokens_details_from_meta_info, which names spec_num_correct_drafts / spec_num_proposed_drafts /
    # spec_verify_ct / spec_correct_drafts_histogram); the older spellings as the releases named them.
    answer_spec=AnswerSpec(
        paths=(("meta_info",), ("choices", 0, "meta_info"), ("sglext", "spec_tokens_details")),
        spellings=(Spelling("spec_num_correct_drafts", "spec_num_proposed_drafts", "spec_verify_ct",
                            "spec_correct_drafts_histogram", ">= 0.5.12"),
                   Spelling("spec_accepted_drafts", "spec_proposed_drafts", "spec_verify_ct", "", "0.5.11"),
                   Spelling("spec_accept_token_num", "spec_draft_token_num", "spec_verify_ct", "", "<= 0.5.10")),
        fix="ask an SGLang that reports them (its native /generate, or return_spec_tokens_details on its "
            "OpenAI routes)"),
    # A FastAPI validation error is 400 (http_server.py, validation_exception_handler); /generate refuses a body
    # without a prompt (managers/io_struct.py).
    refusal_words={"input_ids or input_embeds should be provided": "shape"},
    # python/sglang/srt/managers/tokenizer_manager.py (_handle_batch_output): /generate's answer carries
    # "output_ids" next to "text", unasked; a stream event the ids so far (its incremental --stream-output
    # sends the new ones, which a list that does not start with the ones before is taken as)
    token_ids=TokenIds(("output_ids",), api="sglang", cumulative=True),
    # python/sglang/srt/server_args.py: each ServerArgs field's flag is its name (--tp-size; aliases
    # --tensor-parallel-size, --model, --speculative-draft-model; argparse takes the prefix --tp);
    # _handle_speculative_decoding runs NEXTN as EAGLE.
    engine=EngineRead(
        routes=(("/server_info", sglang_info), ("/get_server_info", sglang_info)),
        flags={"--model-path": "model_path", "--model": "model_path", "--tp-size": "tp_size", "--tp": "tp_size",
               "--tensor-parallel-size": "tp_size", "--dp-size": "dp_size",
               "--speculative-algorithm": "speculative_algorithm",
               "--speculative-draft-model-path": "speculative_draft_model_path",
               "--speculative-draft-model": "speculative_draft_model_path",
               "--speculative-num-steps": "speculative_num_steps",
               "--speculative-eagle-topk": "speculative_eagle_topk",
               "--speculative-num-draft-tokens": "speculative_num_draft_tokens",
               "--speculative-adaptive-config": "speculative_adaptive_config",
               "--context-length": "context_length", "--max-running-requests": "max_running_requests",
               "--mem-fraction-static": "mem_fraction_static", "--kv-cache-dtype": "kv_cache_dtype",
               "--attention-backend": "attention_backend", "--quantization": "quantization"},
        same={"speculative_algorithm": {"NEXTN": "EAGLE"}}),
    # --speculative-adaptive with its config file (python/sglang/srt/speculative/adaptive_spec_params.py)
    schedule=ADAPTIVE)

VLLM: Final = ServerKind(
    "vllm", "vLLM", "openai-completions", sim_profile="vllm",
    # vllm/entrypoints/openai/cli_args.py, vllm/config/model.py
    modules=("vllm.entrypoints.openai.api_server",), serve_programs=("vllm",),
    images=("vllm-openai", "vllm/vllm"), entrypoint=("vllm", "serve"), host=None, port=8000,
    flags={"--host": "host", "--port": "port", "--uds": "uds", "--api-key": "key", "--served-model-name": "model",
           "--model": "weights", "--ssl-keyfile": "tls", "--ssl-certfile": "tls", "--root-path": "prefix"},
    env={"VLLM_API_KEY": "key"},
    key_fix="set VLLM_API_KEY from an EnvironmentFile= only root can read (a process's environment is private "
            "to its user), instead of --api-key or Environment=",
    model_is_weights=True,
    flush=flush_vllm,
    flush_needs="vLLM POST /reset_prefix_cache (only with VLLM_SERVER_DEV_MODE=1 in the server's environment)",
    # vllm/v1/metrics/loggers.py; vllm/v1/spec_decode/metrics.py
    hit_rate=HitRate("vllm:prefix_cache_hits", "vllm:prefix_cache_queries"),
    spec=SpecMetrics("vllm:spec_decode_num_accepted_tokens", "vllm:spec_decode_num_drafts",
                     "vllm:spec_decode_num_draft_tokens", "/metrics spec_decode counters",
                     per_pos="vllm:spec_decode_num_accepted_tokens_per_pos"),
    # An answer's metrics.speculative_decoding, only with --per-request-spec-decode-metrics summary|detailed (null
    # otherwise; the histogram with detailed). The names as the vLLM e2e test test_per_request_spec_decode_metrics
    # reads them (found by find_string; the index did not say its path): mean_acceptance_length == 1 +
    # num_accepted_draft_tokens / num_spec_steps, num_spec_steps == sum(acceptance_histogram), and in a stream the
    # last event alone carries them. The counters: vllm/v1/spec_decode/metrics.py (SpecDecodingProm).
    answer_spec=AnswerSpec(
        paths=(("metrics", "speculative_decoding"),),
        spellings=(Spelling("num_accepted_draft_tokens", "num_draft_tokens", "num_spec_steps", "acceptance_histogram",
                            "with --per-request-spec-decode-metrics"),),
        fix="start vLLM with --per-request-spec-decode-metrics detailed"),
    # vllm/entrypoints/openai/protocol.py (>= 0.10.2): return_token_ids puts a choice's token_ids into its answer,
    # and each stream chunk's new ones into the chunk (an older vLLM ignores the field, with a warning)
    token_ids=TokenIds(("choices", 0, "token_ids"), ask={"return_token_ids": True}),
    # vllm/entrypoints/openai/server_utils.py: validation errors are 400
    refusal_words={"validation error": "shape", "field required": "shape", "extra inputs are not permitted": "shape"},
    # vllm/entrypoints/serve/utils/api_utils.py, log_non_default_args: the start's "non-default args: {...}"
    # line (argparse dests: `vllm serve MODEL` is model_tag); vllm/v1/metrics/loggers.py: *_info gauges
    # (vllm:cache_config_info). A flag set to its default is not in the line: unconfirmed. Only flags that take
    # a value are mapped (a switch such as --enable-prefix-caching would take the next argument for its value).
    engine=EngineRead(
        args_line=vllm_args_line, args_mark=ARGS_MARK, metrics_info=PROMETHEUS.route,
        positional="model_tag",
        flags={"--model": "model", "--tensor-parallel-size": "tensor_parallel_size", "-tp": "tensor_parallel_size",
               "--pipeline-parallel-size": "pipeline_parallel_size", "-pp": "pipeline_parallel_size",
               "--speculative-config": "speculative_config", "-sc": "speculative_config",
               "--max-model-len": "max_model_len", "--max-num-seqs": "max_num_seqs",
               "--gpu-memory-utilization": "gpu_memory_utilization", "--kv-cache-dtype": "kv_cache_dtype",
               "--quantization": "quantization", "-q": "quantization", "--dtype": "dtype"},
        json_flags=frozenset({"--speculative-config", "-sc"})),
    # dynamic speculative decoding (vllm/config/speculative.py, num_speculative_tokens_per_batch_size)
    schedule=PER_BATCH_SIZE)

LLAMA_CPP: Final = ServerKind(
    "llama.cpp", "llama.cpp", "openai-completions", sim_profile="llamacpp",
    # common/arg.cpp
    programs=("llama-server",), images=("llama.cpp", "llama-cpp"), entrypoint=("llama-server",),
    host="127.0.0.1", port=8080,
    flags={"--host": "host", "--port": "port", "--api-key": "key", "--api-key-file": "key_file", "-a": "model",
           "--alias": "model", "--ssl-key-file": "tls", "--ssl-cert-file": "tls", "--api-prefix": "prefix"},
    env={"LLAMA_ARG_HOST": "host", "LLAMA_ARG_PORT": "port", "LLAMA_API_KEY": "key",
         "LLAMA_ARG_API_KEY_FILE": "key_file", "LLAMA_ARG_ALIAS": "model",
         "LLAMA_ARG_SSL_KEY_FILE": "tls", "LLAMA_ARG_SSL_CERT_FILE": "tls", "LLAMA_ARG_API_PREFIX": "prefix"},
    key_fix="use --api-key-file FILE (or LoadCredential=apikey:FILE and "
            "--api-key-file ${CREDENTIALS_DIRECTORY}/apikey)",
    # tools/server/server-http.cpp binds the path as is and leaves the file behind on exit: the next start
    # fails ("couldn't bind HTTP server socket") until someone removes it
    init_notes={"uds": "llama-server leaves {uds} behind when it stops, and a stale one fails the next start: "
                       "give its unit ExecStartPre=-/bin/rm -f {uds}"},
    flush=flush_llamacpp,
    flush_needs="llama-server GET /slots and its slot actions (--slot-save-path DIR, not --no-slots)",
    # tools/server/server-context.cpp: prompt_tokens exclude the cached ones (checked on the real llama-server
    # 11434: two runs of a 376-token prompt counted 753 processed and 375 cached)
    metrics_needs="llama-server needs --metrics",
    hit_rate=HitRate("llamacpp:prompt_tokens_cached", "llamacpp:prompt_tokens", total_excludes_hits=True),
    # tools/server/server-task.cpp: spec_decode_num_drafts counts verify steps (n_draft_verif_steps)
    spec=SpecMetrics("llamacpp:spec_decode_num_accepted_tokens", "llamacpp:spec_decode_num_drafts",
                     "llamacpp:spec_decode_num_draft_tokens", "/metrics llamacpp:spec_decode counters"),
    # server_slot_stats::to_json (tools/server/server-common.cpp): only when the slot drafted
    # no token_ids: its OpenAI routes carry none (tools/server/server-task.cpp: only to_json_non_oaicompat, its own
    # /completion asked with "return_tokens": true, writes "tokens"); its answers are compared by their text
    draft_fields=("draft_n", "draft_n_accepted"),
    answer_spec=AnswerSpec(paths=(("timings",),), spellings=(Spelling("draft_n_accepted", "draft_n"),),
                           fix="upgrade llama-server (recent ones put them into timings whenever a slot drafted)"),
    # Its stream provider (tools/server/server-http.cpp, process_handler_response) returns false after
    # sink.done(), which cpp-httplib's write_content_chunked reports as a failed write: the keep-alive loop
    # ends and the socket is shut down although the headers offered keep-alive.
    server_header="llama.cpp", closes_after_stream=True,
    # tools/server/server-models.cpp: the router without --models-autoload
    refusal_words={"model is not loaded": "router"},
    # common/arg.cpp (build 11434): -m, -np, --spec-type (accumulates after the default "none"),
    # --spec-draft-n-max/-n-min/-p-min (older: --draft-max/--draft-min/--draft-p-min). GET /props has the
    # model and the slots; GET /slots has each slot's speculator and its last task's speculative.* params.
    engine=EngineRead(
        routes=(("/props", llamacpp_props), ("/slots", llamacpp_slots)),
        flags={"-m": "model_path", "--model": "model_path", "-np": "total_slots", "--parallel": "total_slots",
               "--spec-type": "speculative.types", "--spec-draft-n-max": "speculative.n_max",
               "--spec-draft-n-min": "speculative.n_min", "--spec-draft-p-min": "speculative.p_min",
               "--draft-max": "speculative.n_max", "--draft": "speculative.n_max", "--draft-n": "speculative.n_max",
               "--draft-min": "speculative.n_min", "--draft-n-min": "speculative.n_min",
               "--draft-p-min": "speculative.p_min"},
        append={"--spec-type": "none"}))

LLAMA_CPP_PYTHON: Final = ServerKind(
    "llama-cpp-python", "llama-cpp-python", "openai-completions",
    # llama_cpp/server/settings.py, llama_cpp/server/__main__.py
    modules=("llama_cpp.server",), host="localhost", port=8000,
    flags={"--host": "host", "--port": "port", "--api_key": "key", "--model_alias": "model",
           "--ssl_keyfile": "tls", "--ssl_certfile": "tls", "--root_path": "prefix"},
    key_fix="pass the settings as a --config_file JSON file only the server's user can read, instead of --api_key",
    # llama_cpp/server/app.py serves only /v1/*, /tokenize*, /detokenize
    health_route="")

TENSORRT_LLM: Final = ServerKind(
    "tensorrt-llm", "TensorRT-LLM", "openai-completions", sim_profile="trtllm",
    # tensorrt_llm/commands/serve.py: `trtllm-serve MODEL` (its serve command; `trtllm-serve serve MODEL` too),
    # --host localhost, --port 8000; no API key. Its speculative settings (speculative_config) are LLM-API
    # options in the YAML file named by --config / --extra_llm_api_options, not flags.
    programs=("trtllm-serve",), serve_programs=("trtllm-serve",), host="localhost", port=8000,
    flags={"--host": "host", "--port": "port"},
    # tensorrt_llm/serve/openai_server.py: /v1/models lists a local MODEL's directory name (not the path), else
    # MODEL as given, and no route checks a request's `model`: init leaves the model to discovery
    # openai_server.py register_routes: GET /metrics is the JSON iteration stats, drained by each read; the
    # Prometheus page is mounted at /prometheus/metrics, only with return_perf_metrics, and holds request
    # metrics, not speculative decoding's
    metrics=ITERATION_STATS,
    metrics_needs="trtllm-serve fills its /metrics only with enable_iter_perf_stats: true in its "
                  "--extra_llm_api_options YAML",
    spec=SpecMetrics("trtllm_spec_decode_num_accepted_tokens", "trtllm_spec_decode_num_requests_with_draft_tokens",
                     "trtllm_spec_decode_num_draft_tokens", "/metrics specDecodingStats (iteration stats)"))

KINDS: Final[tuple[ServerKind, ...]] = (SGLANG, VLLM, LLAMA_CPP, LLAMA_CPP_PYTHON, TENSORRT_LLM)
BY_NAME: Final[Mapping[str, ServerKind]] = {k.name: k for k in KINDS}


def acceptance_of(deltas: Mapping[str, float]) -> AcceptanceRecord | None:
    """A run's acceptance from its counter deltas: the first kind's record with verify steps (an accept length),
    else the first with draft tokens alone (a page with only some of them, Dynamo's TensorRT-LLM re-export: a
    draft acceptance); None when no kind's counters grew."""
    records = [r for k in KINDS if (r := k.acceptance(deltas)) is not None]
    return next((r for r in records if r.steps), None) or next(iter(records), None)


def counter(deltas: Mapping[str, float], name: str) -> float | None:
    """A counter's delta by its name with `_total` (prometheus_client's) or without; None when on neither page."""
    for sample in (total(name), name):
        if sample in deltas:
            return deltas[sample]
    return None


def positions(deltas: Mapping[str, float], name: str) -> list[float]:
    """A per-position counter's deltas by position 0, 1, … up to the last one on the page ([] without)."""
    for sample in (total(name), name):
        got = {int(k[len(sample) + len(POSITION_LABEL) + 3:-2]): v for k, v in deltas.items()
               if k.startswith(sample + "{" + POSITION_LABEL + '="')}
        if got:
            return [got.get(j, 0.0) for j in range(max(got) + 1)]
    return []


# What a flush needs, in words, and what a server with none of the routes gets.
FLUSH_NEEDS: Final = "; ".join(k.flush_needs for k in KINDS if k.flush_needs)
NO_ROUTE: Final = f"the server has none of the flush routes ({FLUSH_NEEDS})"
FIX: Final = 'set between_points = "restart" in the plan for a fresh start per point'
# A refusal's text that says the request had the wrong shape, and the llama.cpp router's "not loaded".
WRONG_SHAPE: Final = tuple(w for k in KINDS for w, why in k.refusal_words.items() if why == "shape")
ROUTER_NOT_LOADED: Final = tuple(w for k in KINDS for w, why in k.refusal_words.items() if why == "router")
# llama.cpp's router lists each model's status.value (tools/server/server-models.cpp): loading ones
ROUTER_LOADING: Final = frozenset({"loading", "downloading"})


def commands(k: ServerKind) -> str:
    """How `init` recognises a kind, in words: its modules, `PROGRAM serve` and programs."""
    return ", ".join((*k.modules, *(f"{p} serve" for p in k.serve_programs), *k.programs))


def known_words() -> str:
    """Every kind `init` recognises, with its commands, for the words of a command line it does not."""
    return "; ".join(f"{k.label} ({commands(k)})" for k in KINDS)


def api_words() -> str:
    """Which api each kind is spoken to with, for the words of a refused probe."""
    return "; ".join(f"{k.label}: {k.native_api or 'openai-completions or openai-chat'}" for k in KINDS)


def says(body: bytes, words: tuple[str, ...]) -> bool:
    """Whether a refusal's text holds one of the kinds' words (WRONG_SHAPE, ROUTER_NOT_LOADED)."""
    text = body.decode("utf-8", "replace").lower()
    return any(w in text for w in words)


def by_server_header(header: str) -> ServerKind | None:
    """The kind whose Server header this is (`llama.cpp/…`), if any."""
    product = header.split("/")[0]
    return next((k for k in KINDS if k.server_header and k.server_header == product), None)


def closes_after_stream(header: str) -> bool:
    """Whether the server of this Server header closes the connection after every streamed answer."""
    kind = by_server_header(header)
    return kind is not None and kind.closes_after_stream


def by_command(argv: list[str], base: str) -> tuple[ServerKind, list[str]] | None:
    """The kind a command line starts, and its arguments after the program (or module); `base` is argv[0]'s
    base name. Python (`python -m M`, uv) or the server's own program; None when it is none of them."""
    if base.startswith("python") or base in ("uv", "uvx"):
        if "-m" not in argv:
            return None
        j = argv.index("-m")
        module, rest = (argv[j + 1] if j + 1 < len(argv) else ""), argv[j + 2:]
        for k in KINDS:
            if module in k.modules:
                return k, rest
            if module in k.serve_programs and rest[:1] == ["serve"]:
                return k, rest[1:]
        return None
    for k in KINDS:
        if base in k.serve_programs and argv[1:2] == ["serve"]:
            return k, argv[2:]
        if base in k.programs:
            return k, argv[1:]
    return None


# genready's own simulator (`genready simulate --profile NAME`) imitates these kinds (genready_dev/simprofiles.py)
SIMULATED: Final[Mapping[str, str]] = {k.sim_profile: k.name for k in KINDS if k.sim_profile}


def serving(argv: Sequence[str]) -> tuple[ServerKind, list[str]] | None:
    """The kind an ExecStart= argv runs and the server's own arguments, for reading back its configuration
    (servers/engineconfig.py): by_command, or the simulator's profile; None when it is neither."""
    argv = list(argv)
    if not argv:
        return None
    found = by_command(argv, os.path.basename(argv[0]))
    if found is not None:
        return found
    if "simulate" in argv and "--profile" in argv:
        j = argv.index("--profile")
        name = SIMULATED.get(argv[j + 1] if j + 1 < len(argv) else "")
        if name is not None:
            return BY_NAME[name], argv[argv.index("simulate") + 1:]
    return None


def image_entrypoint(image: str) -> tuple[str, ...]:
    """The command of an image whose entrypoint is a known server (by its name), else ()."""
    for k in KINDS:
        if any(fragment in image for fragment in k.images):
            return k.entrypoint
    return ()


async def flush(call: Call, busy_wait: float) -> Flushed:
    """Empty the server's prefix cache by the first kind's route it has; NO_ROUTE when it has none."""
    for k in KINDS:
        if k.flush is not None and (done := await k.flush(call, busy_wait)) is not None:
            return done
    return Flushed(why=NO_ROUTE)


def info_kinds() -> tuple[ServerKind, ...]:
    """The kinds with a server-info route that carries an average accept length."""
    return tuple(k for k in KINDS if k.info_routes and k.info_accept is not None)


def sglang_accept(body: bytes) -> float | None:
    """internal_states[0].avg_spec_accept_length of SGLang's server info (None: not there, or no spec); NaN, or a
    number that cannot be a float (10**400), is no figure: never NaN in the results."""
    try:
        doc = json.loads(body)
        states = doc.get("internal_states") if isinstance(doc, dict) else None
        v = states[0].get("avg_spec_accept_length") if isinstance(states, list) and states else None
    except (ValueError, AttributeError, RecursionError):
        return None
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    return float(v) if isinstance(v, int) and not isinstance(v, bool) and not too_large(v) else None


def by_native_api(api: str) -> ServerKind | None:
    """The kind whose own wire format this api is (SGLang's /generate), if any."""
    return next((k for k in KINDS if k.native_api == api), None)


def metrics_routes(kind: ServerKind | None) -> tuple[str, ...]:
    """The routes to GET for a server's counters: its kind's page, or (kind unknown) every kind's, each once."""
    pages = (kind.metrics,) if kind is not None else tuple(k.metrics for k in KINDS)
    return tuple(dict.fromkeys(p.route for p in pages))


def read_metrics(kind: ServerKind | None, route: str, body: bytes) -> Reading:
    """The counters of a page read from `route`: by the kind's reader, or (kind unknown) the first of the
    kinds' readers for that route that reads it. NotMetrics when none does."""
    pages = (kind.metrics,) if kind is not None else tuple(dict.fromkeys(k.metrics for k in KINDS if
                                                                          k.metrics.route == route))
    why = f"no kind reads {route}"
    for page in pages:
        try:
            return page.reading(body)
        except NotMetrics as e:
            why = str(e)
    raise NotMetrics(why)


def verify_fields() -> tuple[str, ...]:
    return tuple(k.verify_field for k in KINDS if k.verify_field)


def draft_fields() -> tuple[tuple[str, str], ...]:
    return tuple(k.draft_fields for k in KINDS if k.draft_fields)


def answer_spec_kinds() -> tuple[ServerKind, ...]:
    """The kinds whose answers carry their own speculative-decoding counts."""
    return tuple(k for k in KINDS if k.answer_spec is not None)


def spec_kinds() -> tuple[ServerKind, ...]:
    """The kinds with speculative-decoding counters on /metrics."""
    return tuple(k for k in KINDS if k.spec is not None)


def hit_rate_kinds() -> tuple[ServerKind, ...]:
    return tuple(k for k in KINDS if k.hit_rate is not None)
