"""`genready-bench-client` (`python -m genready.benchclient`): a benchmark client for one LLM server.

N requests (or `--duration S` seconds of them) against SGLang's native API or the OpenAI routes, at a
fixed concurrency C or arriving at `--request-rate R` (a Poisson process, or gamma with `--burstiness K`;
at most C in flight), streamed by default. `--slo` judges each request against a latency target
(goodput); every run reports offered against achieved rate and whether it saturated (tools/benchload.py).
It reports what SGLang's bench_serving and vLLM's benchmark_serving report: time to first
token and inter-token latency (p50/p99, from the stream), end-to-end latency, output tokens/s
and requests/s. Requests and the token count follow apis.py, the probe's definitions.

Run under `genready guard` or `genready sweep` it names the verified server process it
measured (GENREADY_PID, GENREADY_INVOCATION_ID, GENREADY_UNIT) and the sweep point
(GENREADY_SWEEP_POINT), so a result can always be traced to one server start. Exit status 1
if any request failed.

The result block is meant for people, but its lines are stable for scripts and the demo:

    benchclient: N requests at concurrency C to URL (API, max_tokens M[, streaming][, Poisson R/s])[, …]
                 (--duration: "requests for S s (at most N)"; --burstiness K: "gamma R/s, burstiness K")
      requests   N ok, F failed[ (…error kinds…)][, E empty][, R retried][, S stale connections skipped]
      rate       R requests/s, T tokens/s over S s
      latency    p50 X ms, p99 Y ms
      ttft       p50 X ms, p99 Y ms          (streaming only)
      itl        p50 X ms, p99 Y ms          (streaming only)
      accept     length L (SOURCE)[, server average A][, draft acceptance D (ACC/DRAFTED drafted tokens)]
                 or: length - (no speculative decoding seen)
      connection new per request: WHY                 (when the server closes kept-alive connections)
      load       offered R/s (scheduled X), achieved Y requests/s, peak concurrency P[, …]; [not ]saturated[: …]
                                                      (with --request-rate or --duration)
      slo        [NOT ]met (PART FOUND <= LIMIT, …); goodput G requests/s, …  (with --slo)
      served by pid P (invocation I, unit U)
      sweep point {…}

An empty answer (valid, but no token: the model's first token ended the sequence) is ok, with 0
tokens. A request that was never sent, because the pooled connection aiohttp gave it had been
closed by the server, is sent once more on a new connection and counted once, as retried; any
other failure counts (see PoolConnector for the server that does this, llama.cpp's).

`--output FILE` appends the same result as one JSON object per line. A progress bar goes to
stderr on a terminal, a plain line per 10 % otherwise.

The accept length of speculative decoding (tokens per verify step of the large model), the
figure a speculative-decoding sweep compares, comes from the server:
- SGLang (`--api sglang`): Σ meta_info.completion_tokens / Σ meta_info.spec_verify_ct over the
  run's requests (sent only when a speculative algorithm runs), and, after the run, GET
  /get_server_info's internal_states[0].avg_spec_accept_length as `server_accept_length`;
- vLLM (the OpenAI APIs): GET /metrics before and after the run, 1 + Δaccepted / Δdrafts of its
  spec_decode counters (vLLM's own "mean acceptance length");
- llama.cpp's llama-server (the OpenAI APIs, started with --metrics): the same from its
  llamacpp:spec_decode_num_{accepted_tokens,drafts}_total counters. Its answers also carry
  timings.draft_n / draft_n_accepted: `draft_acceptance` = Σ accepted / Σ drafted over the run
  (null when no answer drafted), the share of drafted tokens the target model kept.
Without speculative decoding it is null. What is sent: the built-in prompts (tools/prompts.py; by default
six categories, whose figures are also given per category), `--dataset FILE` (a multi-turn question's
later turns each after the answer before it, with the earlier turns and answers), or random token ids
(`--random-input-len`).
"""


import argparse
import asyncio
import dataclasses
import json
import math
import os
import random
import ssl
import stat
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from genready import config, console
from genready.apis import MAX_BODY
from genready.exitcodes import Exit
from genready.servers import kinds
from genready.store import durable
from genready.tools import benchline, benchload, requestline
from genready.tools import prompts as prompt_sets
from genready.tools.benchconn import PoolConnector, StaleConnection, refused_write, why_not_reuse
from genready.tools.benchfigures import Drafts, Outcome, Summary, drafts_of, failures_text, finite, percentile
from genready.tools.benchrun import (
    AUTO,
    DEFAULT_URL,
    LoadOptions,
    Progress,
    ServerOptions,
    discover_model,
    failed,
    one_request,
    one_stream,
    request_body,
    run,
    takes_token_ids,
)
from genready.tools.prompts import Prompt
from genready.tools.requestlog import RequestLog

# The names scripts and tests reach through this module (the client's parts live in bench*.py).
__all__ = ["DEFAULT_URL", "Drafts", "LoadOptions", "Outcome", "PoolConnector", "Progress", "ServerOptions",
           "StaleConnection", "Summary", "discover_model", "drafts_of", "failed", "main", "one_request", "one_stream",
           "percentile", "refused_write", "request_body", "run", "why_not_reuse"]

def served_by(env: Mapping[str, str]) -> dict[str, str] | None:
    """The verified server instance `genready guard` pinned for us, if we run under it."""
    pid = env.get("GENREADY_PID")
    if not pid:
        return None
    return {"pid": pid, "invocation_id": env.get("GENREADY_INVOCATION_ID", "?"),
            "unit": env.get("GENREADY_UNIT", "?")}


def sweep_point(env: Mapping[str, str]) -> Any:
    """The sweep point `genready sweep` runs us for (GENREADY_SWEEP_POINT, JSON), if any."""
    raw = env.get("GENREADY_SWEEP_POINT")
    if not raw:
        return None
    def refuse(token: str) -> Any:
        raise ValueError(token)
    try:
        return json.loads(raw, parse_constant=refuse)  # NaN / Infinity are no JSON: kept as the text they are
    except ValueError:
        return raw


# --duration without -n: at most this many requests (a bound on the run's memory, not a target).
DURATION_REQUEST_CAP: Final = 100_000
DEFAULT_REQUESTS: Final = 50
# Said once after a run of random token ids on a speculative server (vLLM issue #33497, llama.cpp PR #27711).
RANDOM_ACCEPT_NOTE: Final = ("acceptance on random tokens does not predict acceptance on real prompts: drafts of "
                             "random ids are accepted at a rate no real text has; measure acceptance with the "
                             "built-in categories or a --dataset")
RANDOM_POOL: Final = 1000  # --duration: random prompts drawn, then sent again in turn


def arrivals_words(rate: float, burstiness: float) -> str:
    if burstiness == 1.0:
        return f"Poisson {rate:g} requests/s"
    return f"gamma {rate:g} requests/s, burstiness {burstiness:g}"


def header(args: argparse.Namespace, env: Mapping[str, str]) -> str:
    s = served_by(env)
    how = "".join([", streaming" if args.stream else "",
                   f", {arrivals_words(args.request_rate, args.burstiness)}" if args.request_rate else ""])
    count = f"{args.requests} requests" if args.duration is None else \
        f"requests for {args.duration:g} s (at most {args.requests})"
    return (f"benchclient: {count} at concurrency {args.concurrency} to {args.url} "
            f"({args.api}, max_tokens {args.max_tokens}{how})"
            + (f", target {args.target}" if args.target else "") + (f", label {args.label}" if args.label else "")
            + (f", pid {s['pid']}" if s else ""))


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f} ms"


def format_summary(s: Summary, env: Mapping[str, str], *, stream: bool = False,
                   load: benchload.Load | None = None, slo: benchload.SloResult | None = None) -> str:
    lat = s.latencies_ms()
    wall = max(s.wall_seconds, 1e-9)
    errors = s.errors()
    why = ""
    if errors:
        why = f" ({failures_text(errors, s.error_words())})"
    more = "".join([f", {s.empty} empty" if s.empty else "", f", {s.retried} retried" if s.retried else "",
                    f", {s.stale_connections} stale connections skipped" if s.stale_connections else ""])
    lines = [
        f"  requests   {s.ok} ok, {s.failed} failed{why}{more}",
        f"  rate       {s.ok / wall:.1f} requests/s, {s.tokens / wall:.1f} tokens/s over {s.wall_seconds:.2f} s",
        f"  latency    p50 {_ms(percentile(lat, 50))}, p99 {_ms(percentile(lat, 99))}",
    ]
    if stream:
        ttft, itl = s.ttfts_ms(), s.itls_ms()
        lines.append(f"  ttft       p50 {_ms(percentile(ttft, 50))}, p99 {_ms(percentile(ttft, 99))}")
        lines.append(f"  itl        p50 {_ms(percentile(itl, 50))}, p99 {_ms(percentile(itl, 99))}")
    length, source = s.accept()
    server = "" if s.server_accept_length is None else f", server average {s.server_accept_length:.2f}"
    drafts, acceptance = s.drafts(), s.draft_acceptance()
    if drafts is not None and acceptance is not None:
        server += f", draft acceptance {acceptance:.3f} ({drafts.accepted}/{drafts.drafted} drafted tokens)"
    if length is not None:
        lines.append(f"  accept     length {length:.2f} ({source}){server}")
    elif drafts is not None:  # llama.cpp drafted, but its /metrics (--metrics) could not be read
        lines.append(f"  accept     length - (no /metrics spec_decode counters){server}")
    else:
        lines.append(f"  accept     length - (no speculative decoding seen){server}")
    lines += s.acceptance_lines()
    lines += s.category_lines()
    lines += s.turns_line()
    if s.new_connections:
        lines.append(f"  connection new per request: {s.new_connections}")
    if load is not None:
        lines.append(load_line(s, load))
    if slo is not None:
        parts = ", ".join(f"{k} {_ms(_f(t['found_ms']))} {'<=' if t['met'] else '>'} {_f(t['limit_ms']):g}"
                          for k, t in slo.parts.items())
        share = "-" if slo.attainment is None else f"{slo.attainment:.1%}"
        lines.append(f"  slo        {'met' if slo.met else 'NOT met'} ({parts}); goodput {slo.goodput:.2f} "
                     f"requests/s, {slo.good} of {len(s.outcomes) + len(s.unsent)} requests ({share}) met every part")
    who = served_by(env)
    if who:
        lines.append(f"  served by pid {who['pid']} (invocation {who['invocation_id']}, unit {who['unit']})")
    point = sweep_point(env)
    if point is not None:
        lines.append(f"  sweep point {json.dumps(point)}")
    return "\n".join(lines) + "\n"


def _f(v: float | bool | None) -> float:
    return 0.0 if v is None else float(v)


def load_line(s: Summary, load: benchload.Load) -> str:
    """The `load` line: offered against achieved, the peak in flight, and whether the run saturated."""
    def rate(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"
    offered = "closed loop" if load.offered_rate is None else \
        f"offered {load.offered_rate:g} requests/s (scheduled {rate(load.scheduled_rate)})"
    after = s.finished_after_duration()
    verdict = "saturation not judged" if load.saturated is None else \
        ("saturated: " + "; ".join(load.reasons)) if load.saturated else "not saturated"
    return (f"  load       {offered}, achieved {rate(load.achieved_rate)} requests/s, peak concurrency "
            f"{load.peak_concurrency}" + (f", {after} finished after --duration" if after else "")
            + (f", {len(s.unsent)} due but never sent (no free slot)" if s.unsent else "")
            + f"; {verdict}")


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def first_turns(s: Summary) -> list[Outcome]:
    """The outcomes the load figures are judged on: each conversation's first turn. Arrivals are of conversations
    (a later turn goes when the answer before it came, not on a schedule), so achieved and scheduled rates
    compare like with like; single-turn prompts: every request."""
    return [o for o in s.outcomes if o.turn == 0]


def load_json(args: argparse.Namespace, s: Summary, load: benchload.Load,
              slo: benchload.SloResult | None) -> dict[benchline.Field, Any]:
    """The results line's load and SLO fields, the ones a load search reads (docs/benchclient.md)."""
    late = sorted(o.late * 1000 for o in s.outcomes if o.arrival is not None)
    waited = sorted((o.sent - o.arrival) * 1000 for o in s.outcomes if o.arrival is not None)
    return {
        benchline.BURSTINESS: args.burstiness if args.request_rate else None, benchline.DURATION: args.duration,
        benchline.FINISHED_AFTER_DURATION: s.finished_after_duration(),
        benchline.UNSENT_AT_DURATION: len(s.unsent) if s.duration is not None else None,
        benchline.OFFERED_RATE: load.offered_rate, benchline.SCHEDULED_RATE: _r(load.scheduled_rate),
        benchline.ACHIEVED_RATE: _r(load.achieved_rate), benchline.PEAK_CONCURRENCY: load.peak_concurrency,
        benchline.SATURATED: load.saturated, benchline.SATURATION: list(load.reasons),
        benchline.TTFT_TREND: _r(load.trend[0]) if load.trend else None,
        benchline.CLIENT_LAG_P99_MS: _r(percentile(late, 99)),
        benchline.ARRIVAL_WAIT_P99_MS: _r(percentile(waited, 99)),
        benchline.SLO: {p.key: p.limit_ms for p in args.slo} if args.slo else None,
        benchline.SLO_MET: slo.met if slo else None, benchline.SLO_ATTAINMENT: _r6(slo.attainment) if slo else None,
        benchline.GOODPUT: _r(slo.goodput) if slo else None, benchline.GOOD_REQUESTS: slo.good if slo else None,
        benchline.SLO_PARTS: slo.parts if slo else None,
    }


def _r6(v: float | None) -> float | None:
    return None if v is None else round(v, 6)


def result_json(args: argparse.Namespace, s: Summary, env: Mapping[str, str],
                load: benchload.Load | None = None, slo: benchload.SloResult | None = None) -> dict[str, Any]:
    """The `--output` line: each value keyed by its field (tools/benchline.py, which also writes the old names)."""
    lat, ttft, itl = s.latencies_ms(), s.ttfts_ms(), s.itls_ms()
    wall = max(s.wall_seconds, 1e-9)
    load = load or benchload.load_of(first_turns(s), args.request_rate, s.peak_concurrency, s.unsent)
    drafts = s.drafts()
    counters = s.server_counters
    return benchline.line({
        benchline.TIME: time.time(), benchline.LABEL: args.label, benchline.TARGET: args.target,
        benchline.URL: args.url, benchline.API: args.api,
        benchline.REQUESTS: s.requests, benchline.CONCURRENCY: s.concurrency, benchline.REQUEST_RATE: args.request_rate,
        benchline.STREAM: args.stream, benchline.MAX_TOKENS: args.max_tokens,
        benchline.OK: s.ok, benchline.FAILED: s.failed, benchline.ERRORS: dict(s.errors()),
        benchline.ERROR_WORDS: s.error_words() or None, benchline.EMPTY: s.empty,
        benchline.RETRIED: s.retried,
        benchline.STALE_CONNECTIONS: s.stale_connections, benchline.NEW_CONNECTIONS: s.new_connections or None,
        benchline.WALL_SECONDS: round(s.wall_seconds, 6), benchline.REQUESTS_PER_SECOND: round(s.ok / wall, 3),
        benchline.OUTPUT_TOKENS: s.tokens, benchline.OUTPUT_TOKENS_PER_SECOND: round(s.tokens / wall, 3),
        benchline.E2E_P50_MS: _r(percentile(lat, 50)), benchline.E2E_P99_MS: _r(percentile(lat, 99)),
        benchline.TTFT_P50_MS: _r(percentile(ttft, 50)), benchline.TTFT_P99_MS: _r(percentile(ttft, 99)),
        benchline.ITL_P50_MS: _r(percentile(itl, 50)), benchline.ITL_P99_MS: _r(percentile(itl, 99)),
        benchline.ACCEPT_LENGTH: _r(s.accept()[0]), benchline.ACCEPT_LENGTH_SOURCE: s.accept()[1],
        benchline.SERVER_ACCEPT_LENGTH: _r(s.server_accept_length),
        benchline.DRAFT_ACCEPTANCE: _r(s.draft_acceptance()),
        benchline.DRAFT_TOKENS: drafts.drafted if drafts else None,
        benchline.DRAFT_ACCEPTED: drafts.accepted if drafts else None,
        benchline.SPEC_DECODE_COUNTERS: s.metrics_counts, benchline.COUNTERS_ACCEPT_LENGTH: _r(s.metrics_accept),
        benchline.CATEGORIES: s.categories(),
        benchline.CONVERSATIONS: s.conversations, benchline.LATER_TURNS: s.later_turns(),
        benchline.CONVERSATIONS_CUT: s.conversations_cut,
        benchline.PREFIX_CACHE_HIT_RATE: counters.prefix_cache_hit_rate if counters else None,
        benchline.PREFIX_CACHE_SOURCE: counters.prefix_cache_source if counters else None,
        benchline.PROMPTS: args.prompt_source, benchline.TEMPERATURE: args.temperature,
        benchline.IGNORE_EOS: args.ignore_eos,
        benchline.SEED: args.seed,
        benchline.SERVED_BY: served_by(env), benchline.SWEEP_POINT: sweep_point(env),
        benchline.REQUEST_LINES: args.request_lines,
        **load_json(args, s, load, slo),
    }, s.acceptance_fields())


def write_result(path: Path, result: dict[str, Any]) -> None:
    """Append the result as one line of strict JSON (no NaN: jq, JavaScript and Go refuse it), synced, never
    torn (store/durable); a file that ends inside a line (a crash mid-write) gets its line ended first."""
    line = json.dumps(finite(result), sort_keys=True, allow_nan=False) + "\n"
    fd = durable.open_append(path, read=True)
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            durable.end_line(fd)
            durable.append(fd, line.encode())
        else:  # a pipe or a terminal (--output /dev/stdout): nothing to sync or to cut back
            durable.write_all(fd, line.encode())
    finally:
        os.close(fd)


def _positive_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {s!r}")
    return v


def _positive_float(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive number, not {s!r}") from None
    if not v > 0 or math.isinf(v):  # also rejects nan
        raise argparse.ArgumentTypeError(f"must be a positive number, not {s!r}")
    return v


def _number_from(lo: float, hi: float, what: str) -> Callable[[str], float]:
    """An argparse type: a number in [lo, hi] (nan refused), else a usage error saying `what`."""
    def parse(s: str) -> float:
        try:
            v = float(s)
        except ValueError:
            v = math.nan
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"must be {what}, not {s!r}")
        return v
    return parse


def _slo(s: str) -> tuple[benchload.SloPart, ...]:
    try:
        return benchload.parse_slo(s)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


_ratio = _number_from(0.0, 1.0, "a number from 0 to 1")
_non_negative_float = _number_from(0.0, sys.float_info.max, "a number >= 0")


def prompt_set(args: argparse.Namespace) -> list[Prompt]:
    """What to send, from the flags; exits 65 for a bad dataset and 64 for ids an API cannot take.
    Sets args.prompt_source, the words the JSON line keeps."""
    if args.random_input_len and not takes_token_ids(args.api):
        print(f"benchclient: --random-input-len sends token ids, which {args.api} cannot take (it wants chat "
              "messages); use --api sglang or openai-completions", file=sys.stderr)
        raise SystemExit(Exit.BAD_ARGUMENT)
    rng = random.Random(args.seed)
    if args.random_input_len:
        args.prompt_source = (f"random ids: input {args.random_input_len}, output "
                              f"{args.random_output_len or args.max_tokens}, ratio {args.random_range_ratio:g}")
        drawn = args.requests if args.duration is None else min(args.requests, RANDOM_POOL)
        return [prompt_sets.random_prompt(rng, args.random_input_len, args.random_output_len,
                                          args.random_range_ratio) for _ in range(drawn)]
    if args.dataset:
        try:
            base = prompt_sets.load_dataset(Path(args.dataset))
        except prompt_sets.DatasetError as e:
            console.err(f"benchclient: {e}")
            raise SystemExit(Exit.BAD_DATA) from None
        args.prompt_source = f"dataset {args.dataset} ({len(base)} prompts)"
    elif args.prompt is not None:
        base, args.prompt_source = [Prompt(args.prompt)], "--prompt"
    else:
        base = list(prompt_sets.PROMPT_SETS[args.prompts])
        args.prompt_source = f"built-in {args.prompts} ({len(base)} prompts)"
    if args.random_output_len:  # the same prompts, each with its own drawn output length
        return [dataclasses.replace(p, max_tokens=prompt_sets.random_prompt(
            rng, None, args.random_output_len, args.random_range_ratio).max_tokens) for p in base]
    return base


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m genready.benchclient",
        description="Send N generations (or --duration S of them) to an LLM server, at concurrency C or as "
        "Poisson (gamma) arrivals, and print "
        "time to first token and inter-token latency (streaming), end-to-end latency (p50/p99), output tokens/s "
        "and requests/s. Under `genready guard` or `genready sweep` it also names the verified server pid it "
        "measured and the sweep point. Exit status 1 if any request failed. A request fails, and is counted, on "
        f"an answer other than 200 (a redirect is not followed), a non-streamed answer or /v1/models over "
        f"{MAX_BODY >> 20} MiB (not read further), or a stream line over aiohttp's limit; the report is written "
        "whatever the requests did.")
    add_target_flags(p)
    p.add_argument("--kind", default=AUTO, choices=[AUTO, *kinds.BY_NAME],
                   help="the server's kind (servers/kinds.py): which counter page, info route and extra request "
                        "fields to use; auto (the default) tells it once per run by what the server answers")
    p.add_argument("--config", metavar="PATH", help="a genready.toml: take url, api, model, the API key and the "
                   "TLS settings of --target (or $GENREADY_TARGET, set by guard and sweep, or the only target)")
    p.add_argument("-n", "--requests", type=_positive_int, metavar="N",
                   help=f"requests in total, a multi-turn question's later turns included (default: "
                   f"{DEFAULT_REQUESTS}); with --duration, at most N "
                   f"(default: {DURATION_REQUEST_CAP})")
    p.add_argument("-c", "--concurrency", type=_positive_int, default=4, metavar="C",
                   help="requests in flight at once, each of its own conversation (default: %(default)s)")
    p.add_argument("--max-tokens", type=_positive_int, default=32, metavar="M",
                   help="tokens to generate per request (default: %(default)s)")
    p.add_argument("--request-rate", type=_positive_float, metavar="R",
                   help="send requests as a Poisson process of R requests/s (at most C in flight); "
                   "default: C requests back to back")
    p.add_argument("--burstiness", type=_positive_float, default=1.0, metavar="K",
                   help="with --request-rate: gamma-distributed gaps between arrivals, of shape K and mean 1/R, "
                   "as vLLM's benchmark: 1 is Poisson (default), below 1 burstier, above 1 more even")
    p.add_argument("--duration", type=_positive_float, metavar="S",
                   help="send requests for S seconds instead of N requests; those in flight at the end are "
                   "finished, and counted (finished_after_duration)")
    p.add_argument("--slo", type=_slo, metavar="PARTS",
                   help="a latency target, e.g. ttft_p99_ms=500,itl_p50_ms=40,e2e_p99_ms=9000: each request "
                   "judged on its TTFT, mean inter-token latency and end-to-end latency (goodput, "
                   "slo_attainment), and the run's percentiles against the limits (slo_met)")
    p.add_argument("--seed", type=int, help="random seed of the prompts' order, random prompts and the "
                   "arrivals: the same seed sends the same requests at the same times on every sweep point")
    p.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True,
                   help="stream the answers, for time to first token and inter-token latency (default: on)")
    p.add_argument("--timeout", type=_positive_float, default=60.0, metavar="S",
                   help="seconds one request may take, connecting included (default: %(default)s)")
    p.add_argument("--prompt", help="one prompt for every request (default: the built-in set named by --prompts)")
    p.add_argument("--prompts", choices=tuple(prompt_sets.PROMPT_SETS), default=next(iter(prompt_sets.PROMPT_SETS)),
                   help="the built-in set sent without --prompt, --dataset or random ids: categories (8 prompts "
                   "in each of 6 categories, figures per category) or classic (the earlier 32 uncategorised "
                   "prompts) (default: %(default)s)")
    p.add_argument("--dataset", metavar="FILE", help="prompts from FILE: JSON Lines with \"prompt\" (text) or "
                   "\"messages\" (chat) per line and an optional \"category\", Spec-Bench's or MT-bench's "
                   "question.jsonl (question_id, category, turns), or a ShareGPT-style JSON array "
                   "(\"conversations\" of from/value; the first user turn); a question's later turns are sent after "
                   "its earlier answers; exit 65 naming FILE:LINE if it is "
                   "missing, empty or malformed")
    p.add_argument("--random-input-len", type=_positive_int, metavar="N", help="send random token ids, N per "
                   "prompt (no tokenizer needed): SGLang gets input_ids, /v1/completions a prompt of ids; "
                   "openai-chat cannot take them (exit 64)")
    p.add_argument("--random-output-len", type=_positive_int, metavar="M", help="generate M tokens per request "
                   "(instead of --max-tokens); with --random-range-ratio, a length drawn per request")
    p.add_argument("--random-range-ratio", type=_ratio, default=1.0, metavar="R", help="random lengths are "
                   "drawn from [max(1, N*R), N], as SGLang's bench_serving (default 1: exactly N)")
    p.add_argument("--temperature", type=_non_negative_float, default=0.0, metavar="T",
                   help="sampling temperature (default 0: greedy)")
    p.add_argument("--ignore-eos", action="store_true", help="ask the server to generate the full length even "
                   "past an end-of-sequence token (SGLang's and vLLM's ignore_eos)")
    p.add_argument("--target", metavar="NAME", help="genready target name, for the report (and --config)")
    p.add_argument("--label", metavar="TEXT", help="a name for this run, kept in the report and its JSON line")
    p.add_argument("--output", metavar="FILE", help="also append the result as one JSON line to FILE")
    p.add_argument("--requests-output", metavar="FILE", help="append one JSON line per request to FILE: its prompt "
                   "id, tokens, latencies, finish reason, acceptance and answer (bounded; docs/benchclient.md, "
                   f"\"Request lines\") (default: {requestline.REQUESTS_FILE} beside --output's file, when that is "
                   "no device)")
    p.add_argument("--no-requests-output", dest="requests_output", action="store_const", const="",
                   help="write no request lines")
    p.set_defaults(request_lines=None)  # how many request lines the run wrote, for the result line (main sets it)
    return p


# The flags that mirror a target's settings are built from config's settings table (name, help,
# choices), and what they give is checked by config.parse as a target of the config is: one
# definition of each setting, of how a key file is read and of how a TLS context is built.
MIRRORED: Final = ("url", "api", "model", "api_key_file", "ca_file", "tls_verify", "client_cert_file",
                   "client_key_file")
FALLBACK: Final[Mapping[str, object]] = {"url": DEFAULT_URL}  # without --config, where a setting has no default
TLS_SETTINGS: Final = ("ca_file", "tls_verify", "client_cert_file", "client_key_file")
NOTES: Final[Mapping[str, str]] = {"url": "; the bench client itself speaks TCP only"}  # what differs here


def flag(setting: str) -> str:
    return "--" + setting.replace("_", "-")


def add_target_flags(p: argparse.ArgumentParser) -> None:
    """--url, --api, --model, --api-key-file, --ca-file, --[no-]tls-verify, --client-cert-file,
    --client-key-file: each a target setting of config's table, defaulting to the --config target's."""
    table = {s.name: s for s in config.TARGET_SETTINGS}
    for name in MIRRORED:
        s = table[name]
        fallback = FALLBACK.get(name, s.default)
        if s.type is bool:
            p.add_argument(flag(name), action=argparse.BooleanOptionalAction, default=None,
                           help=f"{s.help}{NOTES.get(name, '')} (default: the --config target's, else "
                           f"{'on' if fallback else 'off'})")
            continue
        is_file = name.endswith("_file")
        else_ = f", else {fallback}" if fallback else ""
        p.add_argument(flag(name), default=None, choices=s.choices or None, metavar="FILE" if is_file else None,
                       type=os.path.abspath if is_file else str,  # a file named on the command line: from the cwd
                       help=f"{s.help}{NOTES.get(name, '')} (default: the --config target's{else_})")


def settings(args: argparse.Namespace, env: Mapping[str, str]) -> tuple[str, ssl.SSLContext | None]:
    """The target the requests go to: --config's target (or each setting's default) with the mirrored
    flags given on top, checked as config.parse checks a target; args.url/api/model/target filled in.
    (API key, TLS context or None)."""
    name, table, where = "benchclient", {"unit": "benchclient.service", **FALLBACK}, "the bench client's flags"
    loaded: config.TargetConfig | None = None  # --config's target, as loaded: used as it is when no flag changes it
    if args.config:
        try:
            # A credential is checked by name here: only the target sent to needs its key (below).
            cfg = config.load(Path(args.config), service=False)
        except config.ConfigError as e:
            raise SystemExit(f"benchclient: {e}") from None
        found = cfg.only_target(args.target or env.get("GENREADY_TARGET"))
        if found is None or found not in cfg.targets:
            raise SystemExit(f"benchclient: name a target of {args.config} with --target: {', '.join(cfg.targets)}")
        name, table, where = found, cfg.to_toml_dict()["targets"][found], f"{args.config} with the flags given"
        loaded = cfg.targets[found]
        args.target = name
    given = {n: getattr(args, n) for n in MIRRORED if getattr(args, n) is not None}
    if "api_key_file" in given:
        table["api_key_credential"] = ""  # the flag's key replaces the target's, however it gave one
    if "url" in given:  # another address: the target's transport settings went with its own url
        table["path_prefix"] = ""
        if not given["url"].startswith("https:"):
            table.update({s.name: s.default for s in config.TARGET_SETTINGS if s.name in TLS_SETTINGS})
    try:
        t = loaded if loaded is not None and not given else \
            config.parse({"targets": {name: {**table, **given}}}, where, service=False).targets[name]
    except config.ConfigError as e:
        setting = e.key.rpartition(".")[2]
        if setting in given:
            raise SystemExit(f"benchclient: {flag(setting)}: expected {e.expected}"
                             + (f", found {e.found}" if e.found else "")) from None
        raise SystemExit(f"benchclient: {e}") from None
    if t.unix_path is not None:
        raise SystemExit(f"benchclient: targets.{name} is served on a unix socket ({t.url}), which the bench "
                         "client does not speak: pass --url with a TCP address of the server")
    if t.credential_unchecked:
        raise SystemExit(f"benchclient: {args.config}: targets.{name}.api_key_credential = "
                         f"{t.api_key_credential!r}: only genready.service has $CREDENTIALS_DIRECTORY; "
                         "give the key with --api-key-file FILE (or run under LoadCredential=)")
    for w in t.warnings:
        print(f"benchclient: warning: {w}", file=sys.stderr)
    # The url as the config parsed it, and the TLS context it built (and checked).
    args.url, args.api, args.model = t.endpoint.base_url, t.api, t.model or None
    return t.api_key, t.tls_context


def requests_path(args: argparse.Namespace) -> Path | None:
    """Where the request lines go: --requests-output, else beside --output's file (not beside a device such as
    /dev/stdout); None: nowhere."""
    if args.requests_output is not None:
        return Path(args.requests_output) if args.requests_output else None
    if not args.output or Path(args.output).resolve().parent == Path("/dev"):
        return None
    return Path(args.output).parent / requestline.REQUESTS_FILE


def request_log(args: argparse.Namespace) -> RequestLog | None:
    path = requests_path(args)
    if path is None:
        return None
    try:
        return RequestLog(path)
    except OSError as e:
        print(f"benchclient: cannot write {path}: {e}", file=sys.stderr)
        raise SystemExit(1) from None


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The flags, with the checks between them (argparse's usage error, exit 2, naming the flags)."""
    p = build_parser()
    args = p.parse_args(argv)
    if args.burstiness != 1.0 and not args.request_rate:
        p.error("--burstiness shapes the arrivals of --request-rate: give --request-rate R")
    if args.slo and not args.stream and (bad := [x.key for x in args.slo if x.metric != "e2e"]):
        p.error(f"--slo {','.join(bad)}: time to first token and inter-token latency are measured on a stream; "
                "drop --no-stream or keep to e2e parts")
    if args.requests is None:
        args.requests = DEFAULT_REQUESTS if args.duration is None else DURATION_REQUEST_CAP
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    env = os.environ
    api_key, ssl_context = settings(args, env)
    prompts = prompt_set(args)
    console.out(header(args, env))
    server = ServerOptions(args.url, args.api, args.model, api_key, ssl_context, kind=args.kind)
    load = LoadOptions(args.requests, args.concurrency, args.max_tokens, args.timeout, prompts, stream=args.stream,
                       request_rate=args.request_rate, seed=args.seed, temperature=args.temperature,
                       ignore_eos=args.ignore_eos, burstiness=args.burstiness, duration=args.duration)
    log = request_log(args)
    try:
        summary = asyncio.run(run(server, load, Progress(args.requests, sys.stderr, args.duration), log))
    finally:
        if log is not None:
            log.close()
            args.request_lines = log.lines
    figures = benchload.load_of(first_turns(summary), args.request_rate, summary.peak_concurrency,
                                summary.unsent)
    slo = benchload.judge(summary.outcomes, args.slo, summary.wall_seconds, len(summary.unsent)) \
        if args.slo else None
    shown = figures if args.request_rate or args.duration is not None else None
    console.write(format_summary(summary, env, stream=args.stream, load=shown, slo=slo),
                  sys.stdout)  # a closed stdout: --output still
    if args.random_input_len and summary.speculative():
        console.err(f"benchclient: {RANDOM_ACCEPT_NOTE}")
    if args.output:
        try:
            write_result(Path(args.output), result_json(args, summary, env, figures, slo))
        except OSError as e:
            print(f"benchclient: cannot write {args.output}: {e}", file=sys.stderr)
            return 1
    return 1 if summary.failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
