"""Each run's GPU cost (issue 40 §2): while a point's command runs, every GPU is sampled each second
(gpu/sampling.py, on a thread of its own) through the same provider the daemon uses; the samples go
to `{out}/gpu.json`, and the run's figures (mean power, energy, output tokens per joule, peak memory,
`throttled`) to its results line. A host without NVML or nvidia-smi records none of it (said once).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

from genready.gpu.provider import GpuUnavailable, Provider
from genready.gpu.sampling import Sampler
from genready.gpu.watch import choose
from genready.sweep.files import bench_line
from genready.sweep.run.results import json_text, writing
from genready.tools import benchline

GPU_FILE: Final = "gpu.json"
_provider: list[Provider | None] = []  # chosen once per sweep: [] not yet, [None] none here


def provider(say: Callable[[str], None]) -> Provider | None:
    """The GPU provider, chosen at the first run; None (said once) where none works."""
    if not _provider:
        try:
            _provider.append(choose())
        except GpuUnavailable as e:
            say(f"no GPU figures for the runs: {e}")
            _provider.append(None)
    return _provider[0]


def output_tokens(folder: Path) -> int | None:
    """The run's output tokens, from the last line of its bench.jsonl (the bench client's), if any."""
    with contextlib.suppress(Exception):
        n = (bench_line(folder) or {}).get(benchline.OUTPUT_TOKENS.key)
        if isinstance(n, int) and not isinstance(n, bool) and n >= 0:
            return n
    return None


class Cost:
    """The figures of one run once it ended (`figures`, {} without a provider)."""

    def __init__(self) -> None:
        self.figures: dict[str, Any] = {}


@contextlib.contextmanager
def sampled(say: Callable[[str], None], folder: Path, results: Path, interval: float = 1.0) -> Iterator[Cost]:
    """Sample the GPUs while the block runs; then write `folder`/gpu.json and fill in the figures."""
    cost = Cost()
    p = provider(say)
    if p is None:
        yield cost
        return
    sampler = Sampler(p, interval)
    with sampler:
        yield cost
    summary = sampler.summary(output_tokens(folder))
    cost.figures = summary.to_json()
    doc = {"provider": p.name, "summary": cost.figures,
           "samples": [{"t": round(t - sampler.timeline[0][0], 3),
                        "gpus": [dataclasses.asdict(s) for s in ss]}
                       for t, ss in sampler.timeline]}
    with writing(results):
        (folder / GPU_FILE).write_text(json_text(doc) + "\n")  # strict: a NaN a driver gave is null
