"""`python -m genready.benchclient`: a small benchmark client for one LLM server.

N requests at concurrency C against SGLang's native API or the OpenAI routes, then one
result block: requests ok/failed, requests/s, tokens/s, latency p50/p99. Run under
`genready guard TARGET -- python -m genready.benchclient …` it also prints which verified
server process it measured (guard sets GENREADY_PID, GENREADY_INVOCATION_ID, GENREADY_UNIT),
so a result can always be traced to one server start. Exit status 1 if any request failed.

The result block is meant for people, but its lines are stable for scripts and the demo:

    benchclient: N requests at concurrency C to URL (API, max_tokens M)[, target T][, pid P]
      requests   N ok, F failed[ (…error kinds…)]
      rate       R requests/s, T tokens/s over S s
      latency    p50 X ms, p99 Y ms
      served by pid P (invocation I, unit U)

`--output FILE` appends the same result as one JSON object per line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TextIO

import aiohttp

from genready import apis
from genready.apis import APIS, MODELS_PATH, BadAnswer, ServerApi, model_from_list
from genready.compat import TIMEOUT_ERRORS

# A model name SGLang accepts when /v1/models cannot be read: it serves one model anyway.
FALLBACK_MODEL: Final = "default"
PROGRESS_WIDTH: Final = 30
PROGRESS_INTERVAL: Final = 0.1  # seconds between progress-bar redraws


@dataclass(frozen=True)
class Outcome:
    ok: bool
    seconds: float
    tokens: int = 0
    error: str = ""


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
    except TIMEOUT_ERRORS:
        return Outcome(False, time.perf_counter() - t0, error=f"timeout ({timeout:g} s)")
    except aiohttp.ClientConnectorError as e:
        # asyncio words refusals as "Connect call failed (addr)"; the errno says it shorter.
        err = e.os_error
        why = os.strerror(err.errno) if err.errno else str(err)
        return Outcome(False, time.perf_counter() - t0, error=f"cannot connect: {why}")
    except aiohttp.ClientError as e:
        return Outcome(False, time.perf_counter() - t0, error=f"{type(e).__name__}: {e}")
    except BadAnswer as e:
        return Outcome(False, time.perf_counter() - t0, error=f"bad response: {e}")
    return Outcome(True, took, tokens)


class Progress:
    """A one-line progress bar on a terminal; silent on anything else (logs stay clean)."""

    def __init__(self, total: int, stream: TextIO) -> None:
        self.total = total
        self.stream = stream
        self.enabled = stream.isatty()
        self._last = 0.0

    def update(self, done: int, failed: int, *, force: bool = False) -> None:
        if not self.enabled:
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
              prompt: str, model: str | None, progress: Progress) -> Summary:
    """Send `requests` generations, at most `concurrency` at a time; every one time-bounded."""
    summary = Summary(requests, concurrency)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        if APIS[api].needs_model and model is None:
            model = await discover_model(session, url, timeout)
            if model is None:
                print(f"benchclient: cannot read a model from {url}/v1/models; using {FALLBACK_MODEL!r} "
                      "(pass --model)", file=sys.stderr)
                model = FALLBACK_MODEL
        body = APIS[api].body(prompt=prompt, max_tokens=max_tokens, model=model or "")
        todo = iter(range(requests))

        async def worker() -> None:
            # Workers pull from one shared iterator: exactly `requests` requests in total.
            for _ in todo:
                summary.outcomes.append(await one_request(session, url, APIS[api], body, timeout))
                progress.update(len(summary.outcomes), summary.failed)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(min(concurrency, requests))))
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


def header(args: argparse.Namespace, env: Mapping[str, str]) -> str:
    s = served_by(env)
    return (f"benchclient: {args.requests} requests at concurrency {args.concurrency} to {args.url} "
            f"({args.api}, max_tokens {args.max_tokens})"
            + (f", target {args.target}" if args.target else "") + (f", pid {s['pid']}" if s else ""))


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f} ms"


def format_summary(s: Summary, env: Mapping[str, str]) -> str:
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
    who = served_by(env)
    if who:
        lines.append(f"  served by pid {who['pid']} (invocation {who['invocation_id']}, unit {who['unit']})")
    return "\n".join(lines) + "\n"


def result_json(args: argparse.Namespace, s: Summary, env: Mapping[str, str]) -> dict[str, Any]:
    lat = s.latencies_ms()
    wall = max(s.wall_seconds, 1e-9)
    return {
        "time": time.time(), "target": args.target, "url": args.url, "api": args.api,
        "requests": s.requests, "concurrency": s.concurrency, "max_tokens": args.max_tokens,
        "ok": s.ok, "failed": s.failed, "errors": dict(s.errors()),
        "wall_seconds": round(s.wall_seconds, 6), "requests_per_second": round(s.ok / wall, 3),
        "tokens_per_second": round(s.tokens / wall, 3),
        "latency_p50_ms": percentile(lat, 50), "latency_p99_ms": percentile(lat, 99),
        "served_by": served_by(env),
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
        description="Send N generations at concurrency C to an LLM server and print requests/s, tokens/s and "
        "latency p50/p99. Under `genready guard` it also names the verified server pid it measured. "
        "Exit status 1 if any request failed.")
    p.add_argument("--url", default="http://127.0.0.1:30000", help="the server's base URL (default: %(default)s)")
    p.add_argument("--api", choices=apis.NAMES, default="sglang",
                   help="sglang: POST /generate; openai-completions / openai-chat: POST /v1/completions, "
                   "/v1/chat/completions (default: %(default)s)")
    p.add_argument("-n", "--requests", type=_positive_int, default=50, metavar="N",
                   help="requests in total (default: %(default)s)")
    p.add_argument("-c", "--concurrency", type=_positive_int, default=4, metavar="C",
                   help="requests in flight at once (default: %(default)s)")
    p.add_argument("--max-tokens", type=_positive_int, default=32, metavar="M",
                   help="tokens to generate per request (default: %(default)s)")
    p.add_argument("--timeout", type=_positive_float, default=60.0, metavar="S",
                   help="seconds one request may take, connecting included (default: %(default)s)")
    p.add_argument("--model", help="model name for the OpenAI APIs (default: the first of /v1/models)")
    p.add_argument("--prompt", default="Write one sentence about systemd.", help="the prompt of every request")
    p.add_argument("--target", metavar="NAME", help="genready target name, for the report only")
    p.add_argument("--output", metavar="FILE", help="also append the result as one JSON line to FILE")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.url = args.url.rstrip("/")
    env = os.environ
    print(header(args, env), flush=True)
    summary = asyncio.run(run(
        args.url, args.api, requests=args.requests, concurrency=args.concurrency, max_tokens=args.max_tokens,
        timeout=args.timeout, prompt=args.prompt, model=args.model, progress=Progress(args.requests, sys.stderr)))
    sys.stdout.write(format_summary(summary, env))
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
