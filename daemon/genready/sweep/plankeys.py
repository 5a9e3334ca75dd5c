"""PLAN.toml's top-level keys, each defined once: its name, what it takes, its default, its help and the reader of
its value (as mkosi's settings). plan.py parses a plan with them; the keys with tables of their own (command,
dropin, matrix, points, baseline, prune, expect, search, start, slo) are parsed there, and their rules beyond the
table's in the module of their feature.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from genready.compat import StrEnum
from genready.config import LOAD_TIMEOUT_NO_HISTORY, ConfigError
from genready.sweep import explore as sweepexplore
from genready.timewords import DURATION_WORDS, seconds_of


class Between(StrEnum):
    """`between_points`: what a reused instance gets before each run."""

    FLUSH = "flush"  # its prefix cache emptied through the server's own route (servercache.flush)
    NONE = "none"  # nothing: the run starts on what the run before left (figures biased warm)
    RESTART = "restart"  # no reuse: a fresh start for every run (as --restart-each)


_REQUIRED: Final = object()
_BAD: Final = object()  # what a key's reader answers for a value it does not take


def _number(low: float, *, integer: bool = False, high: float = math.inf, low_open: bool = False
            ) -> Callable[[object], object]:
    def read(v: object) -> object:
        if isinstance(v, bool) or not isinstance(v, int if integer else int | float):
            return _BAD
        if not (low < v if low_open else low <= v) or not v <= high or not math.isfinite(v):
            return _BAD
        return v if integer else float(v)
    return read


def _between(v: object) -> object:
    return Between(v) if isinstance(v, str) and v in tuple(Between) else _BAD


MAX_FAILED_STARTS: Final = 3  # the plan key's default: a broken model path should not cost 48 loads
STABLE: Final = "stable"  # warmup = "stable": until the medians settle (convergence.py)


def _warmup(v: object) -> object:
    return v if v == STABLE else _number(0, integer=True, high=1000)(v)


def _budget(v: object) -> object:
    if not isinstance(v, str | int | float):
        return _BAD
    try:
        seconds = seconds_of(v)
    except ValueError:
        return _BAD
    return seconds if seconds > 0 else _BAD
AUTO: Final = "auto"  # repeats = "auto": runs until the point is clearly behind or ahead (sweep/run/autorepeat.py)


def _repeats(v: object) -> object:
    return v if v == AUTO else _number(1, integer=True, high=1000)(v)


def _noise_check(v: object) -> object:
    if isinstance(v, bool):
        return 2 if v else 0
    return _number(2, integer=True, high=10)(v)


def _target(v: object) -> object:
    return v if isinstance(v, str) and v else _BAD


@dataclass(frozen=True)
class PlanKey:
    """One key of a plan, defined once: its name, what it takes, its default and its help. `read`
    converts a given value (or answers _BAD); None: the key has its own parser below (command, dropin,
    matrix, points)."""

    name: str
    expected: str
    default: Any
    help: str
    read: Callable[[object], object] | None = None

    @property
    def help_text(self) -> str:
        """The help with the default, in the plan's own spelling."""
        if self.default is _REQUIRED or self.default is None:
            return self.help
        shown = f'"{self.default}"' if isinstance(self.default, str) else f"{self.default:g}"
        return f"{self.help} (default {shown})"

    def value(self, data: Mapping[str, Any], file: str) -> Any:
        assert self.read is not None
        if self.name not in data:
            return self.default
        got = self.read(data[self.name])
        if got is _BAD:
            raise ConfigError(file, self.name, self.expected, found_words(data[self.name]))
        return got


KEYS: Final = (
    PlanKey("target", "a target name (string)", None,
            "the genready target to sweep (default: the only one)", _target),
    PlanKey("command", "a string or a list of strings", _REQUIRED,
            "the benchmark: a string split like a shell (no shell), or a list of words"),
    PlanKey("dropin", "unit file text (a string)", None,
            "unit file text for the target's unit, per point (a runtime drop-in)"),
    PlanKey("timeout", "a number of seconds > 0", None,
            "seconds to wait for a verified start per point (default: the target's load_timeout; for "
            f"load_timeout = \"auto\", {LOAD_TIMEOUT_NO_HISTORY:g} s: the sweep does not read the daemon's "
            "load history)",
            _number(0, low_open=True)),
    PlanKey("attempts", "an integer >= 1", 2,
            "runs per point when a run is invalidated or the server does not come up", _number(1, integer=True)),
    PlanKey("matrix", "a table of NAME = [values]", None,
            "a table NAME = [values]: the points are their cartesian product, in file order"),
    PlanKey("points", "[[points]] tables of NAME = value", None, "[[points]] tables of NAME = value: points listed "
            "one by one"),
    # the member, not its value: a plan without the key compares its default with `is Between.FLUSH`
    PlanKey("between_points", " or ".join(f'"{b}"' for b in Between), Between.FLUSH,
            'before each run on a reused instance: "flush" its prefix cache, "none", or "restart" the server',
            _between),
    PlanKey("warmup", 'an integer from 0 to 1000, or "stable"', STABLE,
            'before each run, not counted: "stable" (requests in windows until TTFT and ITL settle) or a number of '
            "requests (the target's probe)", _warmup),
    PlanKey("repeats", 'an integer from 1 to 1000, or "auto"', 1,
            "runs per point on the same instance, each after the warmup (and a flush, with between_points = "
            '"flush"); "auto": more runs only while the point\'s interval overlaps the leader\'s at its client '
            "setting, at most max_repeats (sweep/run/autorepeat.py)", _repeats),
    PlanKey("max_repeats", "an integer from 2 to 1000", 8,
            'repeats = "auto": the most runs a point gets', _number(2, integer=True, high=1000)),
    PlanKey("noise_check", "true, false, or a number of loads from 2 to 10", 0,
            "an A/A start: the first configuration loaded this many times (true: 2) before anything else, to "
            "measure the spread within and between loads that every interval then takes in (sweep/noise.py)",
            _noise_check),
    PlanKey("noise_limit", "a fraction >= 0 (0.10 is 10 %)", 0.10,
            "a point whose relative median absolute deviation over its repeats exceeds this is noisy", _number(0)),
    PlanKey("max_divergence", "a fraction from 0 to 1 (0.10 is 10 %)", 0.10,
            "with a baseline at temperature 0: a point whose answers diverge from the baseline's early (before half "
            "their length) on more than this share of prompts is marked diverged, and never named best "
            "(sweep/report/outputs.py)", _number(0, high=1)),
    PlanKey("baseline", "a table of NAME = value (server-side values), and optionally its own dropin", None,
            'the server configuration speedups are measured against, e.g. { algo = "none" } (sweep/run/baseline.py)'),
    PlanKey("baseline_every", "an integer >= 1", None,
            "run the baseline again after every N server configurations, and mark speedups it drifted under",
            _number(1, integer=True)),
    PlanKey("prune", "an array of server-side axes with numbers", None,
            "axes whose larger values need more memory: a failed start skips every configuration at least as large "
            "on them (and equal on the others); their smaller values run first"),
    PlanKey("max_failed_starts", "an integer >= 1", MAX_FAILED_STARTS,
            "starts in a row that end before they are verified, after which the sweep stops (exit 1; --keep-going "
            "goes on)", _number(1, integer=True)),
    # warmup = "stable" (convergence.py): its windows, its tolerance and its bounds
    PlanKey("warmup_window", "an integer from 1 to 1000", 8,
            'warmup = "stable": requests per window; a window\'s medians are compared with the window before\'s',
            _number(1, integer=True, high=1000)),
    PlanKey("warmup_tolerance", "a fraction > 0 (0.10 is 10 %)", 0.10,
            'warmup = "stable": done when the last window\'s median TTFT and ITL are within this of the window '
            "before's and within half of it of the earliest of the last three (tools/convergence.py)",
            _number(0, low_open=True)),
    PlanKey("warmup_max", "an integer from 2 to 10000, at least twice warmup_window", 96,
            'warmup = "stable": at most this many requests; a run whose warmup stops here is marked unstable',
            _number(2, integer=True, high=10_000)),
    PlanKey("warmup_max_seconds", "a number of seconds > 0", 600.0,
            'warmup = "stable": at most this long (checked between requests); then the run is marked unstable',
            _number(0, low_open=True)),
    PlanKey("expect", "a table of ENGINE_KEY = \"value or {name}\"", None,
            "engine keys the server must report with the point's value, e.g. speculative_num_steps = \"{steps}\" "
            "(a point whose engine reports otherwise is config_mismatch)"),
    PlanKey("stray_wait", "a number of seconds >= 0", 60.0,
            "seconds to wait, before a point's server loads and before its command runs, for processes of an "
            "earlier start that hold memory on the target's GPUs to exit; then the sweep stops naming them "
            "(--ignore-strays: do not wait)", _number(0)),
    PlanKey("gpus", "an integer >= 1", 1,
            "GPUs one server configuration runs on: the html report's tokens/s per GPU divides by it",
            _number(1, integer=True)),
    PlanKey("search", "a table: mode, axis, steps, spacing, max_concurrency, max_steps, slo, start, "
            "max_requests_per_step, max_step_seconds", None,
            "a load search per server configuration (sweep/search.py): each step's bench flags replace the "
            "command's word {search}"),
    PlanKey("strategy", " or ".join(f'"{s}"' for s in sweepexplore.STRATEGIES), sweepexplore.GRID,
            'which server configurations load: "grid" every one, "pattern" a search over the server axes from `start` '
            "(sweep/explore.py)", lambda v: v if isinstance(v, str) and v in sweepexplore.STRATEGIES else _BAD),
    PlanKey("start", "a table giving each server axis one of its values", None,
            'strategy = "pattern": the first configuration loaded (default: the middle of each axis)'),
    PlanKey("audit", "an integer from 0 to 1000", 0, 'strategy = "pattern": configurations not loaded by the search '
            "then loaded at random, to catch a second optimum", _number(0, integer=True, high=1000)),
    PlanKey("audit_seed", "an integer >= 0", 0, "the seed of the audit's random draws", _number(0, integer=True)),
    PlanKey("min_gain", "a fraction from 0 to 1 (0.02 is 2 %)", 0.02, 'strategy = "pattern": a configuration '
            "replaces a best when its output tok/s is higher by more than this (and its 95 % interval)",
            _number(0, high=1)),
    PlanKey("reloads", "an integer from 0 to 1000", sweepexplore.RELOADS, 'strategy = "pattern": the most loads again '
            "of close contenders, the best then named by its mean over loads", _number(0, integer=True, high=1000)),
    PlanKey("slo", "a table of METRIC_pNN_ms = milliseconds, METRIC one of ttft, itl, e2e (the bench client's --slo "
            "parts), e.g. { ttft_p99_ms = 500, itl_p50_ms = 40 }", None,
            "a latency target the report's Decision judges each point by (its bench figures; report/decision.py)"),
    PlanKey("budget", f"{DURATION_WORDS}, > 0", None,
            "the sweep's time: before each load it stops (exit 1) if that load and its runs would not fit, recording "
            "the points not reached; --dry-run says the plan's expected loads and hours (sweep/budget.py)", _budget),
)
PLAN_KEYS: Final = {k.name: k for k in KEYS}
# The keys whose value changes what a run measures: part of each results line's fingerprint (results.py).
# Not `repeats`: it says how many runs, each measured alike (raising it and resuming runs only the new ones),
# and each line names its repeat.
RUN_KEYS: Final = ("between_points", "warmup")


def found_words(v: object) -> str:
    """A value as a plan error's "found" says it: its TOML type, and the value itself where it is short."""
    kinds = {str: "string", bool: "boolean", int: "integer", float: "number", dict: "a table", list: "array"}
    kind = kinds.get(type(v), type(v).__name__)
    return kind if isinstance(v, dict) else f"{kind} {v!r}"[:80]
