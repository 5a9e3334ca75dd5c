"""`genready simulate`'s flags: the argparse table and the checks of each flag's value (sim.py builds the
parser and runs the Simulator with what it reads).
"""

from __future__ import annotations

import argparse
import os
import random

from genready_dev import simbatch, simengine, simoutput, simspec
from genready_dev.simprofiles import PROFILES


def _seconds(s: str) -> float:
    v = float(s)
    if not v >= 0:  # also rejects nan
        raise argparse.ArgumentTypeError(f"must be a non-negative number of seconds, not {s!r}")
    return v


def _fraction(s: str) -> float:
    v = float(s)
    if not 0 <= v <= 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, not {s!r}")
    return v


def _port(s: str) -> int:
    v = int(s)
    if not 0 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"must be 0-65535, not {s!r}")
    return v


def _client_error(s: str) -> int:
    v = int(s)
    if not 400 <= v <= 499:
        raise argparse.ArgumentTypeError(f"must be a 4xx status, not {s!r}")
    return v


def _slowness(s: str) -> float:
    v = float(s)
    if not 1 <= v < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number >= 1 (times a warm process's latency), not {s!r}")
    return v


def _accept_length(s: str) -> float:
    v = float(s)
    if not 1 <= v < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number >= 1 (tokens per verify step), not {s!r}")
    return v


def _probability(s: str) -> float:
    v = float(s)
    if not 0 < v < 1:
        raise argparse.ArgumentTypeError(f"must be above 0 and below 1, not {s!r}")
    return v


def _category_table(s: str) -> dict[str, float]:
    try:
        return simspec.category_table(s)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _file(s: str) -> str:
    if not os.access(s, os.R_OK):
        raise argparse.ArgumentTypeError(f"cannot read {s!r}")
    return s


def _version(s: str) -> str:
    try:
        simspec.version(s)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return s


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", choices=[n for n in PROFILES if n], default=None,
                   help="imitate one server, from its source: sglang (binds once loaded, then a warmup with "
                   "/health 503; /health and /metrics exempt from the key; keeps serving while draining), "
                   "vllm (socket bound at once, listen() once loaded; only /v1* wants the key; no /generate; "
                   "404 for an unknown model), llamacpp (binds at once, 503 \"Loading model\" before the key; "
                   "/health, /models, /v1/models exempt; no /generate), trtllm (socket bound at once, listen() once "
                   "loaded; no key; no /generate; /metrics is JSON iteration stats, drained by each read). Other "
                   "flags apply on top")
    p.add_argument("--warmup-seconds", type=_seconds, default=None, metavar="S",
                   help="once loaded, generations work but /health says 503 for S seconds (SGLang's warmup; "
                   "default: the profile's, 1 s for sglang, else 0)")
    p.add_argument("--unhealthy-after", type=_seconds, default=None, metavar="S",
                   help="S seconds after ready, /health says 503 from then on while generations still work "
                   "(SGLang's UnHealthy)")
    p.add_argument("--served-model-name", nargs="+", metavar="NAME",
                   help="the names the model is listed and served under, the first for requests without "
                   "`model` (vLLM --served-model-name a b; default: --model)")
    p.add_argument("--router", action="store_true",
                   help="llama.cpp's router mode: binds at once, lists --model and --extra-model with their "
                   "state, loads a model (--load-seconds) on POST /models/load or, with --models-autoload, "
                   "on the first request naming it; else such a request gets 400 \"model is not loaded\"")
    p.add_argument("--models-autoload", action="store_true",
                   help="--router: a request for an unloaded model loads it and waits for the load")
    p.add_argument("--skip-tokenizer-init", action="store_true",
                   help="refuse text prompts with 400 like SGLang started with --skip-tokenizer-init; token "
                   "ids (input_ids, or prompt as a list of ints) are served, answers carry no text")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    p.add_argument("--port", type=_port, default=30000,
                   help="port to listen on; 0 picks a free one, shown on the `bound` line "
                   "(default: %(default)s)")
    p.add_argument("--model", default="sim-model", metavar="NAME",
                   help="model name in /v1/models and responses (default: %(default)s)")
    p.add_argument("--load-seconds", type=_seconds, default=0.0, metavar="S",
                   help="time to 'load weights' before generating (default: %(default)s)")
    p.add_argument("--bind-early", action="store_true",
                   help="bind the port before loading; /v1/models and /get_model_info answer 200 while "
                   "generation and /health* answer 503 (older llama.cpp, SGLang warmup). Without it the port "
                   "binds only once loaded (SGLang)")
    p.add_argument("--linger-seconds", type=_seconds, default=None, metavar="S",
                   help="after SIGTERM/SIGINT keep serving generations (/health* say 503) for S seconds, "
                   "then exit 0; further signals do not shorten it (default: the profile's, else 0)")
    p.add_argument("--crash-after", type=_seconds, default=None, metavar="S",
                   help="S seconds after ready, exit abruptly with status 1")
    p.add_argument("--fail-load", metavar="WHY", default="",
                   help="fail the load: after --load-seconds, print a CUDA out-of-memory line naming WHY and exit 1 "
                   "before binding, as a server whose configuration does not fit in GPU memory")
    p.add_argument("--hang-after", type=_seconds, default=None, metavar="S",
                   help="S seconds after ready, keep accepting connections but never answer again (SIGUSR1: "
                   "from then on)")
    p.add_argument("--fail-rate", type=_fraction, default=0.0, metavar="P",
                   help="fraction of generations answered 500 (/health* answer 503) (default: %(default)s)")
    p.add_argument("--token-latency", type=_seconds, default=0.0, metavar="S",
                   help="seconds per generated token, also paces streamed chunks (default: %(default)s)")
    p.add_argument("--reuse-port", action="store_true",
                   help="set SO_REUSEPORT so an old and a new process can listen on the port at once")
    p.add_argument("--uds", metavar="PATH", help="listen on this unix socket instead of --host/--port "
                   "(vLLM --uds, llama.cpp --host PATH.sock); a stale socket file there is replaced (--profile "
                   "llamacpp: fails the start, and the file is left behind on exit, as llama.cpp does)")
    p.add_argument("--api-key", metavar="KEY", help="answer 401 {\"error\":\"Unauthorized\"} to every request "
                   "without `Authorization: Bearer KEY` (or x-api-key: KEY), except /health* (SGLang --api-key)")
    p.add_argument("--tls-cert", type=_file, metavar="PEM", help="serve HTTPS with this certificate (chain); "
                   "needs --tls-key (SGLang/vLLM --ssl-certfile)")
    p.add_argument("--tls-key", type=_file, metavar="PEM", help="the certificate's private key (--ssl-keyfile)")
    p.add_argument("--tls-client-ca", type=_file, metavar="PEM", help="mutual TLS: require a client certificate "
                   "signed by this CA (vLLM --ssl-ca-certs with --ssl-cert-reqs 2)")
    p.add_argument("--no-chat-template", action="store_true",
                   help="answer chat completions 400 like vLLM for a model without a chat template")
    p.add_argument("--extra-model", action="append", default=[], metavar="NAME",
                   help="list another model in /v1/models (repeatable), as a server with LoRA adapters does")
    p.add_argument("--output-fault", type=simoutput.fault, metavar="KIND:N",
                   help="break the answers on purpose from token N on (genready_dev/simoutput.py): diverge:N "
                   "answers other words than a healthy simulator's, loop:N repeats one short phrase")
    p.add_argument("--spec-accept", type=_accept_length, metavar="X",
                   help="speculative decoding with mean accept length X (>= 1): SGLang's meta_info.spec_verify_ct "
                   "and GET /get_server_info's internal_states[0].avg_spec_accept_length, vLLM's "
                   "vllm:spec_decode_* counters on GET /metrics")
    p.add_argument("--spec-accept-category", type=_category_table, metavar="NAME=X,...",
                   help="with --spec-accept or --spec-alpha: the bench client's built-in prompts of category NAME are "
                   "accepted at length X (e.g. coding=3.6,math_reasoning=3.2,writing=1.8); other prompts at "
                   "--spec-accept, or the model's")
    p.add_argument("--spec-alpha", type=_probability, metavar="A",
                   help="the speculative model (instead of --spec-accept): each draft token accepted with "
                   "probability A, scaled per built-in category (code and maths above writing); accept length and "
                   "the verify step's time follow --speculative-num-steps, --speculative-eagle-topk and "
                   "--speculative-num-draft-tokens (docs/sweeps.md, \"The simulator knows the truth\")")
    p.add_argument("--spec-draft-cost", type=_seconds, default=simspec.DEFAULT_DRAFT_COST, metavar="C",
                   help="with --spec-alpha: one draft step's time over a plain decode step's (Leviathan et al.'s "
                   "c) (default: %(default)s)")
    p.add_argument("--spec-verify-cost", type=_seconds, default=simspec.DEFAULT_VERIFY_COST, metavar="V",
                   help="with --spec-alpha: each verified draft token's share of a decode step; a verify step "
                   "takes --token-latency x (1 + C steps + V (draft tokens - 1)) (default: %(default)s)")
    p.add_argument("--sglang-version", type=_version, default=simspec.SGLANG_DEFAULT_VERSION, metavar="V",
                   help="with --spec-accept: the SGLang release whose meta_info names the per-request counts "
                   "(<= 0.5.10 spec_accept_token_num/spec_draft_token_num, 0.5.11 spec_accepted_drafts/"
                   "spec_proposed_drafts, >= 0.5.12 spec_num_correct_drafts/spec_num_proposed_drafts and "
                   "sglext.spec_tokens_details; default %(default)s)")
    p.add_argument("--per-request-spec-decode-metrics", choices=simspec.PER_REQUEST_MODES, default="none",
                   help="--profile vllm with --spec-accept: answers carry metrics.speculative_decoding "
                   "(detailed: with acceptance_histogram), as vLLM's flag; default %(default)s")
    p.add_argument("--spec-metrics-accept", type=_accept_length, metavar="Y",
                   help="with --spec-accept X: the /metrics counters count accept length Y, the answers X "
                   "(two sources that disagree)")
    p.add_argument("--prefill-latency", type=_seconds, default=0.0, metavar="S",
                   help="seconds per prompt token before the first token, skipped for a prompt in the prefix cache "
                   "(a prompt seen since start or the last flush: SGLang /flush_cache, vLLM /reset_prefix_cache "
                   "with VLLM_SERVER_DEV_MODE=1, llama.cpp POST /slots/ID?action=erase) (default: %(default)s)")
    p.add_argument("--parallel", type=int, default=1, metavar="N",
                   help="--profile llamacpp: the slots GET /slots lists (llama-server -np) (default: %(default)s)")
    p.add_argument("--slot-save-path", metavar="DIR", default="",
                   help="--profile llamacpp: allow the slot actions (POST /slots/ID?action=erase); without it they "
                   "answer 501, as llama-server's do")
    p.add_argument("--no-slots", action="store_true",
                   help="--profile llamacpp: GET /slots and its actions answer 501, as llama-server --no-slots")
    p.add_argument("--reasoning-tokens", type=int, default=0, metavar="N",
                   help="stream a chat answer's first N tokens as delta.reasoning (vLLM's reasoning models)")
    p.add_argument("--cold-requests", type=int, default=0, metavar="N",
                   help="a cold process: its first N generations are slower, the k-th by 1 + (F-1)*exp(-3k/N) "
                   "(prefill and every token; F is --cold-factor), then as fast as a warm one (default: %(default)s)")
    p.add_argument("--cold-factor", type=_slowness, default=1.73, metavar="F",
                   help="--cold-requests: how much slower the first generation is (>= 1; default %(default)s: "
                   "SGLang issue #28706's 6,350 ms TTFT after a restart against 3,661 ms converged)")
    p.add_argument("--reject", type=_client_error, metavar="STATUS",
                   help="answer every generation with this 4xx status once loaded (e.g. 403, 405, 422)")
    p.add_argument("--load-noise", type=_fraction, default=0.0, metavar="SD",
                   help="load-to-load noise (issue 51 §5): each start draws one factor from a normal of mean 1 and "
                   "this standard deviation (0.03 is 3 %%), and multiplies every step's and prefill's time by it "
                   "(default: %(default)s, none)")
    p.add_argument("--load-noise-seed", type=int, default=None, metavar="N",
                   help="--load-noise: draw the factor from this seed (default: a fresh one each start)")
    p.add_argument("--surface", type=int, default=None, metavar="SEED",
                   help="with --batch-max-running: pace decode steps by truth surface SEED "
                   "(genready_dev/simsurface.py, issue 51 §5) for the configuration the SGLang flags give "
                   "(--speculative-num-steps, --speculative-eagle-topk, --speculative-num-draft-tokens)")
    simbatch.add_arguments(p)
    simengine.add_arguments(p)


def apply_load_noise(a: argparse.Namespace) -> float:
    """--load-noise: this start's factor on every step's and prefill's time (1.0 without), applied to `a`.

    A real engine's figures move from load to load (memory placement, clocks, CUDA-graph capture), not only
    from run to run: a sweep that repeats runs within one load sees none of it (issue 51 §1)."""
    if a.load_noise <= 0:
        return 1.0
    factor = max(0.5, random.Random(a.load_noise_seed).gauss(1.0, a.load_noise))
    a.token_latency *= factor
    a.prefill_latency *= factor
    a.batch_token_seconds *= factor
    return factor
