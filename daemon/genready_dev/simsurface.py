"""Truth surfaces over three server axes (issue 51 §5): what a search over server configurations is measured
against.

`genready simulate --surface SEED` (with `--batch-max-running`) paces its batch's decode steps by this module's
`step`, for the configuration its SGLang flags give: γ `--speculative-num-steps`, k `--speculative-eagle-topk`,
N `--speculative-num-draft-tokens` (the shape of the real case: a tree's depth, its width and the tokens the
target verifies a step). `true_tps` is the same function over a whole run, so a bench or a test knows each
configuration's true figure at each client setting without running it.

The model (ours, written down so that a search's answer can be checked; built on simspec's):
- each draft token is accepted with probability α; with k candidates at a depth the depth is accepted with
  α_k = 1 - (1 - α)^k (simspec's SpecModel). The N - 1 draft tokens verified a step reach a depth d, a soft
  minimum of γ and (N - 1) / k (a top-N tree ranked by confidence is neither as deep as γ nor as deep as its
  tokens spread k a depth go, where the two are near): d = (γ^-4 + ((N - 1) / k)^-4)^(-1/4); a step yields
  X = (1 - α_k^(d+1)) / (1 - α_k) tokens (Leviathan et al. 2023's expected tokens a step);
- a step of b requests takes t0 (1 + c γ (1 + κ (k - 1))) + s b N: t0 `--token-latency` (the weights read once
  a step), c the cost of a draft step and κ what each further candidate adds to it, s `--batch-token-seconds`
  for each of the N tokens a request puts through the target a step (simbatch's linear batch model; SGLang
  verifies `--speculative-num-draft-tokens` tokens a request). So deep, wide trees pay at one request in
  flight and lose at many, where the s b N term dominates: the best configuration moves with the client's
  concurrency, and depth, width and N must grow together (a ridge across the axes);
- some surfaces (every third seed from 1) have a tuned tree shape: one topk and N whose step takes `bump` times
  the time (as attention backends differ by tree shape), a local optimum of its own;
- the seed draws α, c, κ and the tuned shape.
Load-to-load noise is the simulator's own `--load-noise` (simargs.apply_load_noise: t0 and s times one factor
per start); a run's own noise is the machine's.
"""

from __future__ import annotations

import argparse
import math
import random
from dataclasses import dataclass
from typing import Final

from genready.servers import kinds
from genready_dev import simengine, simspec

# The axes of the 4 x 4 x 3 case (issue 51): γ, k, N in SGLang's flags, as a plan's matrix lists them.
STEPS: Final = (1, 2, 4, 6)
TOPK: Final = (1, 2, 4, 8)
DRAFT_TOKENS: Final = (4, 8, 16)
AXES: Final = (("steps", STEPS), ("topk", TOPK), ("draft_tokens", DRAFT_TOKENS))
FLAGS: Final = {"steps": "--speculative-num-steps", "topk": "--speculative-eagle-topk",
                "draft_tokens": "--speculative-num-draft-tokens"}
# The plan's client settings (concurrency) and the simulator's pacing that the benches and tests use.
CONCURRENCY: Final = (1, 4, 16)
TOKEN_LATENCY: Final = 0.004  # t0
SOFTMIN: Final = 4.0  # the depth's soft minimum: (a^-p + b^-p)^(-1/p)
BATCH_TOKEN_SECONDS: Final = 0.0003  # s


@dataclass(frozen=True)
class Surface:
    """One truth surface: the model's settings a seed drew (module doc)."""

    seed: int
    alpha: float
    draft_cost: float  # c
    topk_cost: float  # κ
    bump: float = 1.0  # the tuned tree shape's factor on its step time (1.0: none)
    bump_topk: int = 0
    bump_draft_tokens: int = 0

    def shape(self, steps: int, topk: int, draft_tokens: int) -> Shape:
        return Shape(self, steps, topk, draft_tokens)


@dataclass(frozen=True)
class Shape:
    """One configuration on a surface: its accept length and its step's time at a batch size."""

    surface: Surface
    steps: int
    topk: int
    draft_tokens: int

    @property
    def depth(self) -> float:
        """d, the depth the N - 1 verified draft tokens reach: a soft minimum of γ and (N - 1) / k (the tree's
        depth, and how deep N - 1 tokens go at k a depth), as a top-N tree ranked by confidence reaches less
        than either bound where both are near."""
        bound = (self.draft_tokens - 1) / self.topk
        return float((float(self.steps) ** -SOFTMIN + bound ** -SOFTMIN) ** (-1 / SOFTMIN))

    @property
    def accept(self) -> float:
        """X, the tokens a request gains a step."""
        ak = 1.0 - (1.0 - self.surface.alpha) ** self.topk
        return float((1.0 - ak ** (self.depth + 1)) / (1.0 - ak))

    @property
    def width(self) -> int:
        """w, the tokens a request puts through the target model a step."""
        return self.draft_tokens

    def step_seconds(self, batch: int, token_latency: float, token_seconds: float) -> float:
        s = self.surface
        draft = s.draft_cost * self.steps * (1.0 + s.topk_cost * (self.topk - 1))
        t = token_latency * (1.0 + draft) + token_seconds * batch * self.width
        tuned = self.topk == s.bump_topk and self.draft_tokens == s.bump_draft_tokens
        return t * (s.bump if tuned else 1.0)


def surface(seed: int) -> Surface:
    """The surface of `seed`: every third seed (1, 4, 7, ...) has a tuned tree shape, a second local optimum."""
    rng = random.Random(f"genready-surface-{seed}")
    alpha, c, kappa = rng.uniform(0.55, 0.85), rng.uniform(0.06, 0.2), rng.uniform(0.05, 0.35)
    if seed % 3 != 1:
        return Surface(seed, alpha, c, kappa)
    return Surface(seed, alpha, c, kappa, bump=rng.uniform(0.78, 0.88), bump_topk=rng.choice(TOPK[2:]),
                   bump_draft_tokens=rng.choice(DRAFT_TOKENS[:2]))


def steps_for(tokens: int, accept: float) -> int:
    """Decode steps for `tokens` output tokens at X tokens a step (the batcher's credit: floor(k X) >= tokens)."""
    k = math.ceil(tokens / accept - 1e-9)
    return k if math.floor(k * accept + 1e-9) >= tokens else k + 1


def true_tps(seed: int, config: tuple[int, int, int], concurrency: int, *, tokens: int = 24, requests: int = 48,
             token_latency: float = TOKEN_LATENCY, token_seconds: float = BATCH_TOKEN_SECONDS) -> float:
    """The output tok/s of a run of `requests` requests of `tokens` tokens, `concurrency` at a time (each slot
    takes the next request when its last ends), on a simulator of this surface and configuration (γ, k, N):
    the requests of a round start together and gain alike, so they end together; prefill and HTTP aside."""
    shape = surface(seed).shape(*config)
    rounds = math.ceil(requests / max(1, concurrency))
    batch = min(concurrency, requests)
    wall = rounds * steps_for(tokens, shape.accept) * shape.step_seconds(batch, token_latency, token_seconds)
    return requests * tokens / wall


def from_args(a: argparse.Namespace) -> Shape | None:
    """The configuration `--surface SEED` paces by: the SGLang flags' γ, k and N (simspec's defaults: γ 3, k 1,
    N = γ k + 1); None without --surface."""
    if getattr(a, "surface", None) is None:
        return None
    got = simengine.settings(a, kinds.SGLANG)
    steps = got.get("speculative_num_steps") or simspec.DEFAULT_STEPS
    topk = got.get("speculative_eagle_topk") or 1
    n = got.get("speculative_num_draft_tokens") or steps * topk + 1
    for name, v in (("--speculative-num-steps", steps), ("--speculative-eagle-topk", topk),
                    ("--speculative-num-draft-tokens", n)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: expected a whole number >= 1, found {v!r}")
    return surface(a.surface).shape(steps, topk, n)


def configs() -> list[tuple[int, int, int]]:
    """Every configuration of the 4 x 4 x 3 grid, in the plan's (matrix) order."""
    return [(g, k, n) for g in STEPS for k in TOPK for n in DRAFT_TOKENS]


def best(seed: int, concurrency: int, **kw: float) -> tuple[tuple[int, int, int], float]:
    """The true best configuration at a client setting and its figure."""
    return max(((c, true_tps(seed, c, concurrency, **kw)) for c in configs()), key=lambda cv: cv[1])  # type: ignore[arg-type]
