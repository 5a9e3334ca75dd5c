"""`genready-bench-client` (`python -m genready.benchclient`): a benchmark client for one LLM server.

N requests against SGLang's native API or the OpenAI routes, at a fixed concurrency C or
arriving as a Poisson process (`--request-rate R`, at most C in flight), streamed by default.
It reports what SGLang's bench_serving and vLLM's benchmark_serving report: time to first
token and inter-token latency (p50/p99, from the stream), end-to-end latency, output tokens/s
and requests/s. Requests and the token count follow apis.py, the probe's definitions.

Run under `genready guard` or `genready sweep` it names the verified server process it
measured (GENREADY_PID, GENREADY_INVOCATION_ID, GENREADY_UNIT) and the sweep point
(GENREADY_SWEEP_POINT), so a result can always be traced to one server start. Exit status 1
if any request failed.

The result block is meant for people, but its lines are stable for scripts and the demo:

    benchclient: N requests at concurrency C to URL (API, max_tokens M[, streaming][, Poisson R/s])[, …]
      requests   N ok, F failed[ (…error kinds…)]
      rate       R requests/s, T tokens/s over S s
      latency    p50 X ms, p99 Y ms
      ttft       p50 X ms, p99 Y ms          (streaming only)
      itl        p50 X ms, p99 Y ms          (streaming only)
      served by pid P (invocation I, unit U)
      sweep point {…}

`--output FILE` appends the same result as one JSON object per line. A progress bar goes to
stderr on a terminal, a plain line per 10 % otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import ssl
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TextIO

import aiohttp

from genready import apis, config, tls
from genready.apis import APIS, MODELS_PATH, BadAnswer, ServerApi, model_from_list
from genready.compat import TIMEOUT_ERRORS

# A model name SGLang accepts when /v1/models cannot be read: it serves one model anyway.
FALLBACK_MODEL: Final = "default"
DEFAULT_URL: Final = "http://127.0.0.1:30000"
PROGRESS_WIDTH: Final = 30
PROGRESS_INTERVAL: Final = 0.1  # seconds between progress-bar redraws


@dataclass(frozen=True)
class Outcome:
    ok: bool
    seconds: float
    tokens: int = 0
    error: str = ""
    ttft: float | None = None  # seconds to the first event with output (streaming only)
    itl: tuple[float, ...] = ()  # seconds between later events with output


@dataclass
class Summary:
    requests: int
    concurrency: int
    wall_seconds: float = 0.0
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def ok(self) -> int:
        return sum(1 for o in self.outcomes if o.ok)

    @property
    def failed(self) -> int:
        return len(self.outcomes) - self.ok

    @property
    def tokens(self) -> int:
        return sum(o.tokens for o in self.outcomes if o.ok)

    def errors(self) -> Counter[str]:
        return Counter(o.error for o in self.outcomes if not o.ok)

    def latencies_ms(self) -> list[float]:
        # Only successful requests: a refused connection's 1 ms would flatter the server.
        return sorted(o.seconds * 1000 for o in self.outcomes if o.ok)

    def ttfts_ms(self) -> list[float]:
        return sorted(o.ttft * 1000 for o in self.outcomes if o.ok and o.ttft is not None)

    def itls_ms(self) -> list[float]:
        # Every gap of every request, as bench_serving pools them: a p99 of token gaps, not of requests.
        return sorted(gap * 1000 for o in self.outcomes if o.ok for gap in o.itl)


def percentile(sorted_values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile (no interpolation: every reported figure was measured)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


async def discover_model(session: aiohttp.ClientSession, url: str, timeout: float) -> str | None:
    """The first model id from /v1/models, or None when it cannot be read."""
    try:
        async with session.get(url + MODELS_PATH, timeout=aiohttp.ClientTimeout(total=timeout)) as r:
            if r.status != 200:
                return None
            return model_from_list(await r.read())
    except (aiohttp.ClientError, BadAnswer):
        return None
    except TIMEOUT_ERRORS:
        return None


# What a request to the server may raise that is the server's doing (or the network's).
_REQUEST_ERRORS: tuple[type[BaseException], ...] = (*TIMEOUT_ERRORS, aiohttp.ClientError, BadAnswer)
# A stream adds ValueError: an SSE line over aiohttp's line limit.
_STREAM_ERRORS: tuple[type[BaseException], ...] = (*_REQUEST_ERRORS, ValueError)


async def one_request(session: aiohttp.ClientSession, url: str, api: ServerApi, body: dict[str, Any],
                      timeout: float) -> Outcome:
    t0 = time.perf_counter()
    try:
        async with session.post(url + api.path, json=body, timeout=aiohttp.ClientTimeout(total=timeout)) as r:
            raw = await r.read()
            took = time.perf_counter() - t0
            if r.status != 200:
                return Outcome(False, took, error=f"HTTP {r.status}")
        # The probe's rule (apis.py): a 200 counts only if it shows a generated token.
        tokens = api.generated_tokens(raw)
    except _REQUEST_ERRORS as e:
        return _failed(e, t0, timeout)
    return Outcome(True, took, tokens)


def _failed(e: BaseException, t0: float, timeout: float) -> Outcome:
    """The Outcome of a request started at `t0` that raised `e`, in words a reader can act on."""
    took = time.perf_counter() - t0
    if isinstance(e, TIMEOUT_ERRORS):
        return Outcome(False, took, error=f"timeout ({timeout:g} s)")
    if isinstance(e, aiohttp.ClientConnectorError):
        # asyncio words refusals as "Connect call failed (addr)"; the errno says it shorter.
        err = e.os_error
        why = os.strerror(err.errno) if err.errno else str(err)
        return Outcome(False, took, error=f"cannot connect: {why}")
    if isinstance(e, BadAnswer):
        return Outcome(False, took, error=f"bad response: {e}")
    return Outcome(False, took, error=f"{type(e).__name__}: {e}")


async def one_stream(session: aiohttp.ClientSession, url: str, api: ServerApi, body: dict[str, Any],
                     timeout: float) -> Outcome:
    """One streamed generation: TTFT and the gaps between events that carried output."""
    t0 = time.perf_counter()
    tokens, first, last, gaps, done = 0, None, 0.0, list[float](), False
    try:
        async with session.post(url + api.path, json=body, timeout=aiohttp.ClientTimeout(total=timeout)) as r:
            if r.status != 200:
                await r.read()
                return Outcome(False, time.perf_counter() - t0, error=f"HTTP {r.status}")
            async for raw in r.content:  # one SSE line at a time
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                tokens, new = apis.streamed(api, data, tokens)
                if new:
                    now = time.perf_counter()
                    if first is None:
                        first = now - t0
                    else:
                        gaps.append(now - last)
                    last = now
            took = time.perf_counter() - t0
        if not done:
            raise BadAnswer("the stream ended without data: [DONE]")
        if tokens < 1:
            raise BadAnswer("the stream carried no generated token")
    except _STREAM_ERRORS as e:
        return _failed(e, t0, timeout)
    return Outcome(True, took, tokens, ttft=first, itl=tuple(gaps))


class Progress:
    """A one-line progress bar on a terminal; on anything else a plain line per 10 % (logs stay readable)."""

    def __init__(self, total: int, stream: TextIO) -> None:
        self.total = total
        self.stream = stream
        self.enabled = stream.isatty()
        self._last = 0.0
        self._tenths = 0

    def update(self, done: int, failed: int, *, force: bool = False) -> None:
        if not self.enabled:
            tenths = 10 * done // max(1, self.total)
            if tenths > self._tenths:
                self._tenths = tenths
                self.stream.write(f"benchclient: {done}/{self.total} done" + (f", {failed} failed" if failed else "")
                                  + "\n")
                self.stream.flush()
            return
        now = time.monotonic()
        if not force and now - self._last < PROGRESS_INTERVAL and done < self.total:
            return
        self._last = now
        filled = PROGRESS_WIDTH * done // max(1, self.total)
        bar = "#" * filled + "-" * (PROGRESS_WIDTH - filled)
        self.stream.write(f"\r[{bar}] {done}/{self.total}" + (f"  {failed} failed" if failed else ""))
        self.stream.flush()

    def clear(self) -> None:
        if self.enabled:
            self.stream.write("\r\033[K")
            self.stream.flush()


async def run(url: str, api: str, *, requests: int, concurrency: int, max_tokens: int, timeout: float,
              prompt: str, model: str | None, progress: Progress, stream: bool = True,
              request_rate: float | None = None, seed: int | None = None, api_key: str = "",
              ssl_context: ssl.SSLContext | None = None) -> Summary:
    """Send `requests` generations, at most `concurrency` at a time; every one time-bounded.

    Without `request_rate` C workers send back to back; with it, requests arrive as a Poisson
    process of that rate (exponential gaps, as bench_serving's --request-rate), still at most C
    in flight."""
    summary = Summary(requests, concurrency)
    server = APIS[api]
    connector = aiohttp.TCPConnector(limit=concurrency, ssl=ssl_context if ssl_context is not None else True)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:
        if server.needs_model and model is None:
            model = await discover_model(session, url, timeout)
            if model is None:
                print(f"benchclient: cannot read a model from {url}/v1/models; using {FALLBACK_MODEL!r} "
                      "(pass --model)", file=sys.stderr)
                model = FALLBACK_MODEL
        if stream:
            body = apis.stream_body(server, prompt=prompt, max_tokens=max_tokens, model=model or "")
        else:
            body = server.body(prompt=prompt, max_tokens=max_tokens, model=model or "")
        send = one_stream if stream else one_request

        async def one() -> None:
            summary.outcomes.append(await send(session, url, server, body, timeout))
            progress.update(len(summary.outcomes), summary.failed)

        t0 = time.perf_counter()
        if request_rate is None:
            todo = iter(range(requests))

            async def worker() -> None:
                for _ in todo:  # workers pull from one shared iterator: exactly `requests` in total
                    await one()

            await asyncio.gather(*(worker() for _ in range(min(concurrency, requests))))
        else:
            rng = random.Random(seed)
            slots = asyncio.Semaphore(concurrency)

            async def limited() -> None:
                async with slots:
                    await one()

            tasks = []
            for i in range(requests):
                tasks.append(asyncio.ensure_future(limited()))
                if i + 1 < requests:
                    await asyncio.sleep(rng.expovariate(request_rate))
            await asyncio.gather(*tasks)
        summary.wall_seconds = time.perf_counter() - t0
    progress.update(len(summary.outcomes), summary.failed, force=True)
    progress.clear()
    return summary


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
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def header(args: argparse.Namespace, env: Mapping[str, str]) -> str:
    s = served_by(env)
    how = "".join([", streaming" if args.stream else "",
                   f", Poisson {args.request_rate:g} requests/s" if args.request_rate else ""])
    return (f"benchclient: {args.requests} requests at concurrency {args.concurrency} to {args.url} "
            f"({args.api}, max_tokens {args.max_tokens}{how})"
            + (f", target {args.target}" if args.target else "") + (f", label {args.label}" if args.label else "")
            + (f", pid {s['pid']}" if s else ""))


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f} ms"


def format_summary(s: Summary, env: Mapping[str, str], *, stream: bool = False) -> str:
    lat = s.latencies_ms()
    wall = max(s.wall_seconds, 1e-9)
    errors = s.errors()
    why = ""
    if errors:
        why = " (" + ", ".join(f"{n}x {e}" for e, n in errors.most_common(3)) + (
            ", …" if len(errors) > 3 else "") + ")"
    lines = [
        f"  requests   {s.ok} ok, {s.failed} failed{why}",
        f"  rate       {s.ok / wall:.1f} requests/s, {s.tokens / wall:.1f} tokens/s over {s.wall_seconds:.2f} s",
        f"  latency    p50 {_ms(percentile(lat, 50))}, p99 {_ms(percentile(lat, 99))}",
    ]
    if stream:
        ttft, itl = s.ttfts_ms(), s.itls_ms()
        lines.append(f"  ttft       p50 {_ms(percentile(ttft, 50))}, p99 {_ms(percentile(ttft, 99))}")
        lines.append(f"  itl        p50 {_ms(percentile(itl, 50))}, p99 {_ms(percentile(itl, 99))}")
    who = served_by(env)
    if who:
        lines.append(f"  served by pid {who['pid']} (invocation {who['invocation_id']}, unit {who['unit']})")
    point = sweep_point(env)
    if point is not None:
        lines.append(f"  sweep point {json.dumps(point)}")
    return "\n".join(lines) + "\n"


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def result_json(args: argparse.Namespace, s: Summary, env: Mapping[str, str]) -> dict[str, Any]:
    lat, ttft, itl = s.latencies_ms(), s.ttfts_ms(), s.itls_ms()
    wall = max(s.wall_seconds, 1e-9)
    return {
        "time": time.time(), "label": args.label, "target": args.target, "url": args.url, "api": args.api,
        "requests": s.requests, "concurrency": s.concurrency, "request_rate": args.request_rate,
        "stream": args.stream, "max_tokens": args.max_tokens,
        "ok": s.ok, "failed": s.failed, "errors": dict(s.errors()),
        "wall_seconds": round(s.wall_seconds, 6), "requests_per_second": round(s.ok / wall, 3),
        "tokens_per_second": round(s.tokens / wall, 3), "output_tokens": s.tokens,
        "output_tokens_per_second": round(s.tokens / wall, 3),
        "latency_p50_ms": _r(percentile(lat, 50)), "latency_p99_ms": _r(percentile(lat, 99)),
        "e2e_p50_ms": _r(percentile(lat, 50)), "e2e_p99_ms": _r(percentile(lat, 99)),
        "ttft_p50_ms": _r(percentile(ttft, 50)), "ttft_p99_ms": _r(percentile(ttft, 99)),
        "itl_p50_ms": _r(percentile(itl, 50)), "itl_p99_ms": _r(percentile(itl, 99)),
        "served_by": served_by(env), "sweep_point": sweep_point(env),
    }


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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m genready.benchclient",
        description="Send N generations to an LLM server, at concurrency C or as Poisson arrivals, and print "
        "time to first token and inter-token latency (streaming), end-to-end latency (p50/p99), output tokens/s "
        "and requests/s. Under `genready guard` or `genready sweep` it also names the verified server pid it "
        "measured and the sweep point. Exit status 1 if any request failed.")
    p.add_argument("--url", help=f"the server's base URL (default: the --config target's, else {DEFAULT_URL})")
    p.add_argument("--api", choices=apis.NAMES,
                   help="sglang: POST /generate; openai-completions / openai-chat: POST /v1/completions, "
                   "/v1/chat/completions (default: the --config target's, else sglang)")
    p.add_argument("--config", metavar="PATH", help="a genready.toml: take url, api, model, the API key and the "
                   "TLS settings of --target (or $GENREADY_TARGET, set by guard and sweep, or the only target)")
    p.add_argument("--api-key-file", metavar="FILE", help="send the key in FILE as Authorization: Bearer")
    p.add_argument("-n", "--requests", type=_positive_int, default=50, metavar="N",
                   help="requests in total (default: %(default)s)")
    p.add_argument("-c", "--concurrency", type=_positive_int, default=4, metavar="C",
                   help="requests in flight at once (default: %(default)s)")
    p.add_argument("--max-tokens", type=_positive_int, default=32, metavar="M",
                   help="tokens to generate per request (default: %(default)s)")
    p.add_argument("--request-rate", type=_positive_float, metavar="R",
                   help="send requests as a Poisson process of R requests/s (at most C in flight); "
                   "default: C requests back to back")
    p.add_argument("--seed", type=int, help="random seed of the Poisson arrivals, for a repeatable schedule")
    p.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True,
                   help="stream the answers, for time to first token and inter-token latency (default: on)")
    p.add_argument("--timeout", type=_positive_float, default=60.0, metavar="S",
                   help="seconds one request may take, connecting included (default: %(default)s)")
    p.add_argument("--model", help="model name for the OpenAI APIs (default: the first of /v1/models)")
    p.add_argument("--prompt", default="Write one sentence about systemd.", help="the prompt of every request")
    p.add_argument("--target", metavar="NAME", help="genready target name, for the report (and --config)")
    p.add_argument("--label", metavar="TEXT", help="a name for this run, kept in the report and its JSON line")
    p.add_argument("--output", metavar="FILE", help="also append the result as one JSON line to FILE")
    return p


def settings(args: argparse.Namespace, env: Mapping[str, str]) -> tuple[str, ssl.SSLContext | None]:
    """Fill url/api/model from --config's target (explicit flags win); (API key, TLS context or None)."""
    key, ctx = "", None
    if args.config:
        try:
            cfg = config.load(Path(args.config))
        except config.ConfigError as e:
            raise SystemExit(f"benchclient: {e}") from None
        name = args.target or env.get("GENREADY_TARGET") or (next(iter(cfg.targets)) if len(cfg.targets) == 1
                                                              else None)
        if name is None or name not in cfg.targets:
            raise SystemExit(f"benchclient: name a target of {args.config} with --target: {', '.join(cfg.targets)}")
        t = cfg.targets[name]
        args.target = name
        args.url, args.api, args.model = args.url or t.url, args.api or t.api, args.model or t.model or None
        key = t.api_key
        if t.url.startswith("https:"):
            try:
                ctx = tls.client_context(t.ca_file, t.tls_verify, t.client_cert_file, t.client_key_file)
            except tls.TlsSetupError as e:
                raise SystemExit(f"benchclient: {args.config}: targets.{name}: {e}") from None
    if args.api_key_file:
        try:
            key = Path(args.api_key_file).read_text().strip()
        except OSError as e:
            raise SystemExit(f"benchclient: cannot read --api-key-file {args.api_key_file}: {e.strerror}") from None
    args.url = (args.url or DEFAULT_URL).rstrip("/")
    args.api = args.api or "sglang"
    return key, ctx


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    env = os.environ
    api_key, ssl_context = settings(args, env)
    print(header(args, env), flush=True)
    summary = asyncio.run(run(
        args.url, args.api, requests=args.requests, concurrency=args.concurrency, max_tokens=args.max_tokens,
        timeout=args.timeout, prompt=args.prompt, model=args.model, progress=Progress(args.requests, sys.stderr),
        stream=args.stream, request_rate=args.request_rate, seed=args.seed, api_key=api_key,
        ssl_context=ssl_context))
    sys.stdout.write(format_summary(summary, env, stream=args.stream))
    sys.stdout.flush()
    if args.output:
        try:
            with open(args.output, "a") as f:
                f.write(json.dumps(result_json(args, summary, env), sort_keys=True) + "\n")
        except OSError as e:
            print(f"benchclient: cannot write {args.output}: {e}", file=sys.stderr)
            return 1
    return 1 if summary.failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
