"""The simulator's batch model (issue 39 §4): continuous batching, so that it saturates like a server.

Off unless `--batch-max-running N` is given; then every generation's decode goes through one scheduler.

What follows a published description, and what is only a model:
- Continuous (iteration-level) batching follows Orca (Yu et al., OSDI 2022, "iteration-level scheduling")
  as vLLM implements it: a request joins or leaves the running batch between decode steps, at most
  `max_num_seqs` run at once and the rest wait in FIFO order (vllm/v1/core/sched/scheduler.py:
  `self.max_num_running_reqs = self.scheduler_config.max_num_seqs`, and the waiting loop stops once
  `len(self.running) == self.max_num_running_reqs`). SGLang's `--max-running-requests` is the same cap.
- The step time is a MODEL, not a published formula: t(b, w) = t0 + s * b * w for b running requests each
  putting w tokens through the target model. t0 (`--token-latency`) stands for the memory-bound cost of
  reading the weights once per step, s (`--batch-token-seconds`) for the compute per token in the step.
  That decode is memory-bound at small batch and turns compute-bound as the batch grows is the usual
  roofline account; the linear form is ours.
- A speculative verify step (`--spec-accept X`) puts w = k + 1 tokens per request through the target model
  (k = ceil(X) drafts, the same k the vLLM counters report, plus the bonus token) and yields X tokens per
  request on average. Draft cost is folded into t0. Also a model: it is the standard argument for why
  speculation pays at low batch and loses at high batch, written down so the crossover is computable.

With `--spec-alpha` (simspec.SpecModel, issue 52 §3) the depth is the server's own setting: a verify step at
depth d puts w = d k + 1 tokens per request through the target model, yields X(d) tokens per request (the
SpecModel's accept length at that depth, for the prompt-neutral α) and costs the drafting t0 c d (c
`--spec-draft-cost`): t(b, d) = t0 (1 + c d) + s b w. Depth 0 is a plain step. vLLM's dynamic speculative
decoding (`num_speculative_tokens_per_batch_size` in `--speculative-config`) then chooses d per step from the
number of requests in it, as its scheduler does (vllm/v1/core/sched/scheduler.py:
`dynamic_sd_lookup[len(num_scheduled_tokens)]`), through the dense lookup its source builds
(vllm/v1/spec_decode/dynamic/utils.py, `vllm_depths` here). No cost of switching is modelled: vLLM captures a
CUDA-graph set per depth of the schedule at start (v1/worker/gpu/cudagraph_utils.py) and switches between steps.
SGLang's `--speculative-adaptive` (its config's tiers, the running batch padded to its CUDA-graph size, each
tier's EMA moving among its candidate steps after each verify) is simadaptive.py's, chosen here the same way,
before each step, and fed each step's accepted drafts after it; its switches cost nothing per step either.
So the best depth moves with load: deep at one request in flight, where t0 dominates, and none at many, where
the s b w term does (`depth_tps` gives the truth per batch size).

From the model, below the cap and ignoring prefill, with n output tokens per request at arrival rate λ
(Little's law: b = λ * decode time):
- plain decode time L_p = n t0 / (1 - λ n s), speculative L_s = (n / X) t0 / (1 - λ n s w / X);
- they are equal at λ* = (X - 1) / (n s (w - 1)) (`crossover_rate`): speculation wins below, loses above;
- at the cap M, the server serves at most M / (steps per request * t(M, w)) requests/s (`capacity`).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace

from genready_dev import simadaptive, simspec, simsurface


@dataclass(frozen=True)
class BatchModel:
    """The settings of the batch model: the cap, t0, s, and the speculative accept length (None: plain)."""

    max_running: int
    step_seconds: float  # t0: a decode step at batch size 0 (the weights read once)
    token_seconds: float  # s: each token through the target model in a step adds this
    spec_accept: float | None = None
    spec: simspec.SpecModel | None = None  # --spec-alpha: the depth's accept length and drafting cost (module doc)
    depths: tuple[int, ...] | None = None  # vLLM's schedule as its dense lookup: the depth at each batch size
    surface: simsurface.Shape | None = None  # --surface: its configuration's accept length and step time
    adaptive: simadaptive.Adaptive | None = None  # SGLang's --speculative-adaptive: its tiers' slots, per step

    @property
    def width(self) -> int:
        """w: tokens per request through the target model in one step (k drafts + 1 when speculating)."""
        return 1 if self.spec_accept is None else max(1, math.ceil(self.spec_accept)) + 1

    @property
    def per_step(self) -> float:
        """Tokens a running request gains per step on average: X when speculating, else 1."""
        return 1.0 if self.spec_accept is None else self.spec_accept


def depth_at(m: BatchModel, batch: int) -> int | None:
    """The speculative depth of a step of `batch` requests under the spec model (the schedule's, else the
    server's setting); None without one."""
    if m.spec is None:
        return None
    if m.depths is not None:
        return m.depths[max(1, min(batch, len(m.depths) - 1))]
    if m.adaptive is not None:
        return m.adaptive.steps_for(batch)
    return m.spec.steps


def _at_depth(m: BatchModel, d: int) -> tuple[int, float, float]:
    """(w, X, the drafting's share of t0) at depth d under the spec model."""
    assert m.spec is not None
    if d == 0:
        return 1, 1.0, 0.0
    x = replace(m.spec, steps=d, draft_tokens=None, table=None).accept(None)
    return d * m.spec.topk + 1, x, m.spec.draft_cost * d


def step_gain(m: BatchModel, batch: int) -> float:
    """Tokens each running request gains in a step of `batch` requests."""
    if m.surface is not None:
        return m.surface.accept
    d = depth_at(m, batch)
    return m.per_step if d is None else _at_depth(m, d)[1]


def step_time(m: BatchModel, batch: int) -> float:
    """Seconds of one decode step with `batch` running requests: t0 + s * batch * w (a model); under the spec
    model t0 (1 + c d) + s b w at the step's depth d; under --surface its own (simsurface.py)."""
    if m.surface is not None:
        return m.surface.step_seconds(batch, m.step_seconds, m.token_seconds)
    d = depth_at(m, batch)
    if d is None:
        return m.step_seconds + m.token_seconds * batch * m.width
    w, _, draft = _at_depth(m, d)
    return m.step_seconds * (1.0 + draft) + m.token_seconds * batch * w


def depth_tps(m: BatchModel, batch: int, depth: int) -> float:
    """Output tokens/s of a full batch of `batch` requests run at `depth` (the truth a schedule is judged by)."""
    fixed = replace(m, depths=(0, *([depth] * batch)))
    return batch * step_gain(fixed, batch) / step_time(fixed, batch)


def vllm_depths(schedule: object, max_batch: int, cap: int) -> tuple[int, ...]:
    """vLLM's `num_speculative_tokens_per_batch_size` (its 3-item form) as its dense lookup, index = batch size
    (vllm/v1/spec_decode/dynamic/utils.py: validate_and_normalize_dynamic_sd_schedule and
    build_dynamic_sd_schedule_lookup): ranges from 1, sorted, not overlapping, K >= 0; a gap and the tail take
    the previous range's K, every K capped at num_speculative_tokens (`cap`). ValueError as vLLM refuses."""
    if not isinstance(schedule, list) or not schedule:
        raise ValueError("num_speculative_tokens_per_batch_size must be a non-empty list")
    parsed = []
    for e in schedule:
        if not isinstance(e, list | tuple) or len(e) != 3 or not all(isinstance(v, int) for v in e):
            raise ValueError(f"num_speculative_tokens_per_batch_size: expected [start, end, K], found {e!r}")
        lo, hi, k = e
        if lo <= 0 or hi < lo or k < 0:
            raise ValueError(f"num_speculative_tokens_per_batch_size: a bad range {e!r}")
        parsed.append((lo, hi, k))
    parsed.sort()
    if parsed[0][0] != 1 or any(b[0] <= a[1] for a, b in itertools.pairwise(parsed)):
        raise ValueError("num_speculative_tokens_per_batch_size: ranges must start at 1 and not overlap")
    dense = [0] * (max_batch + 1)
    for i, (lo, hi, k) in enumerate(parsed):
        end = parsed[i + 1][0] - 1 if i + 1 < len(parsed) else max_batch  # a gap and the tail carry K on
        for b in range(lo, min(max(hi, end), max_batch) + 1):
            dense[b] = min(cap, k)
    return tuple(dense)


def steps_for(m: BatchModel, tokens: int) -> int:
    """Decode steps a request of `tokens` output tokens runs for."""
    return math.ceil(tokens / m.per_step) if tokens > 0 else 0


def capacity(m: BatchModel, tokens: int) -> float:
    """Requests/s the server completes with the batch full (max_running requests of `tokens` tokens)."""
    return m.max_running / (steps_for(m, tokens) * step_time(m, m.max_running))


def decode_seconds(m: BatchModel, tokens: int, rate: float) -> float:
    """Mean decode time of a request at arrival rate `rate` below the cap (Little's law); inf past it."""
    denom = 1.0 - rate * tokens * m.token_seconds * m.width / m.per_step
    if denom <= 0:
        return math.inf
    return tokens / m.per_step * m.step_seconds / denom


def crossover_rate(m: BatchModel, tokens: int) -> float | None:
    """Arrival rate λ* = (X - 1) / (n s (w - 1)) above which speculation decodes slower than plain decoding;
    None where it always pays (no per-token cost, or every draft accepted) or there is no speculation."""
    x = m.spec_accept
    if x is None or m.token_seconds <= 0 or x >= m.width or tokens <= 0:
        return None
    return (x - 1.0) / (tokens * m.token_seconds * (m.width - 1))


def crossover_batch(m: BatchModel) -> float | None:
    """Batch size b* = t0 (X - 1) / (s (w - X)) above which a speculative step yields fewer tokens/s per
    request than a plain one; None where speculation always pays."""
    x = m.spec_accept
    if x is None or m.token_seconds <= 0 or x >= m.width:
        return None
    return m.step_seconds * (x - 1.0) / (m.token_seconds * (m.width - x))


@dataclass
class _Seq:
    tokens: int
    credit: float = 0.0  # tokens earned so far (fractional while speculating)
    given: int = 0
    gone: bool = False  # the client left: drop it at the next step
    ready: asyncio.Queue[int] = field(default_factory=asyncio.Queue)


class Batcher:
    """One scheduler loop: each step admits waiting requests up to the cap (FIFO), sleeps t(b, w), then hands
    each running request its tokens; it stops when nothing runs or waits and restarts on the next request."""

    def __init__(self, model: BatchModel) -> None:
        self.m = model
        self.waiting: deque[_Seq] = deque()
        self.running: list[_Seq] = []
        self.peak_running = 0
        self.steps = 0  # decode steps run since start
        self._loop: asyncio.Task[None] | None = None

    async def decode(self, tokens: int) -> AsyncIterator[int]:
        """Yields 0..tokens-1 as the batch produces them."""
        if tokens <= 0:
            return
        seq = _Seq(tokens)
        self.waiting.append(seq)
        if self._loop is None or self._loop.done():
            self._loop = asyncio.get_running_loop().create_task(self._run())
        try:
            i = 0
            while i < tokens:
                upto = await seq.ready.get()
                while i < upto:
                    yield i
                    i += 1
        finally:
            seq.gone = True

    async def _run(self) -> None:
        # Steps are kept on a clock (each ends t(b, w) after the last one ended, not after the event loop woke
        # up late), so a loaded machine's timer overshoot does not add to every step; a loop more than a step
        # behind starts afresh rather than run steps back to back.
        loop = asyncio.get_running_loop()
        end = loop.time()
        while self.waiting or self.running:
            self.running = [s for s in self.running if not s.gone]
            while self.waiting and len(self.running) < self.m.max_running:
                s = self.waiting.popleft()
                if not s.gone:
                    self.running.append(s)
            if not self.running:
                continue
            self.peak_running = max(self.peak_running, len(self.running))
            dt, gain = step_time(self.m, len(self.running)), step_gain(self.m, len(self.running))
            now = loop.time()
            end = end + dt if end >= now - dt else now + dt
            await asyncio.sleep(max(0.0, end - loop.time()))
            self.steps += 1
            if self.m.adaptive is not None:  # the verify's accepted drafts per request feed its tier's EMA
                self.m.adaptive.verified(len(self.running), gain - 1.0)
            for s in self.running:
                s.credit += gain
                now = min(s.tokens, math.floor(s.credit + 1e-9))
                if now > s.given:
                    s.given = now
                    s.ready.put_nowait(now)
            self.running = [s for s in self.running if s.given < s.tokens]


def _positive_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, found {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, found {s!r}")
    return v


def _nonneg_seconds(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, found {s!r}") from None
    if not v >= 0 or math.isinf(v):
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, found {s!r}")
    return v


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("batch model (issue 39 §4; off unless --batch-max-running is given)")
    g.add_argument("--batch-max-running", type=_positive_int, default=None, metavar="N",
                   help="continuous batching: at most N generations decode together, the rest queue (vLLM "
                   "--max-num-seqs, SGLang --max-running-requests); a step takes --token-latency plus "
                   "--batch-token-seconds per token in the batch")
    g.add_argument("--batch-token-seconds", type=_nonneg_seconds, default=0.0, metavar="S",
                   help="with --batch-max-running: seconds each token through the model adds to a decode step "
                   "(a speculative request puts ceil(--spec-accept)+1 through per step) (default: %(default)s)")


def from_args(a: argparse.Namespace, spec: simspec.SpecModel | None = None,
              speculative_config: object = None, adaptive: simadaptive.Adaptive | None = None) -> BatchModel | None:
    """The batch model the flags ask for, or None (the simulator's per-request pacing, as before); with `spec`
    (--spec-alpha) the depth-aware model, switching by vLLM's schedule when `speculative_config` (its
    --speculative-config) has one (ValueError for a schedule vLLM refuses), or by SGLang's `adaptive`."""
    if a.batch_max_running is None:
        return None
    depths = None
    if spec is not None and isinstance(speculative_config, dict) and \
            (table := speculative_config.get("num_speculative_tokens_per_batch_size")) is not None:
        depths = vllm_depths(table, a.batch_max_running, spec.steps)
    return BatchModel(max_running=a.batch_max_running, step_seconds=a.token_latency,
                      token_seconds=a.batch_token_seconds, spec_accept=a.spec_accept, spec=spec, depths=depths,
                      surface=simsurface.from_args(a), adaptive=adaptive if spec is not None else None)
