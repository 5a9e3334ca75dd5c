"""A `genready sweep` plan: PLAN.toml parsed into points, with `{name}` placeholders.

`{name}` is a matrix (or [[points]]) value and `{out}` the point's folder; nothing else is a
placeholder: systemd's `$VAR`/`${VAR}` (and `$$`) pass through for systemd, `{{`/`}}` write a
literal brace. The points are the matrix's cartesian product in file order, then [[points]].
A bad plan is a ConfigError naming file, key, expected and found, exit 78 (as config.py).

A value substituted into the drop-in reaches systemd as written: its `%` is doubled (systemd
would read `%h` as a specifier, and drop a whole `Environment=` line over an unknown one such
as `%Z`), and a value ending in `\\` is refused (systemd would join the next line to it).
"""

from __future__ import annotations

import itertools
import json
import math
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from genready.config import ConfigError, read_toml
from genready.sweep import explore as sweepexplore
from genready.sweep import search as sweepsearch
from genready.sweep.plankeys import AUTO, KEYS, PLAN_KEYS, STABLE, Between, found_words
from genready.tools.benchload import SloPart, parse_slo

Scalar = str | int | float | bool
# A plan is expanded into memory whole (and --dry-run prints it): 20 axes of 2 values would be a
# million points. Counted before any point is built.
MAX_POINTS: Final = 10_000
# A plan file is read whole: bounded like the config file, and only a regular file (a FIFO would block).
MAX_PLAN_BYTES: Final = 16 << 20
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SEARCH_WORD: Final = ("search",)  # the command's word a search step's bench flags replace
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")

@dataclass(frozen=True)
class Template:
    """Text with `{name}` placeholders; `{{`/`}}` are literal braces, `$VAR`/`${VAR}` are systemd's."""

    parts: tuple[str | tuple[str], ...]  # literal text, or (placeholder name,)

    @classmethod
    def parse(cls, text: str, file: str, key: str) -> Template:
        parts: list[str | tuple[str]] = []
        buf: list[str] = []
        i, n = 0, len(text)
        while i < n:
            c = text[i]
            if c == "$" and text.startswith("${", i):
                end = text.find("}", i)
                if end < 0:
                    raise ConfigError(file, key, "a closed ${VAR}", repr(text[i:i + 30]))
                buf.append(text[i:end + 1])  # left for systemd (or the shell of the command) to expand
                i = end + 1
            elif c == "$" and text.startswith("$$", i):
                buf.append("$$")  # systemd's literal dollar: "$${x}" is a dollar, then a placeholder
                i += 2
            elif text.startswith("{{", i) or text.startswith("}}", i):
                buf.append(c)
                i += 2
            elif c == "{":
                m = _PLACEHOLDER.match(text, i)
                if not m:
                    raise ConfigError(file, key, "a placeholder {NAME}, or {{ for a literal brace",
                                      repr(text[i:i + 30]))
                parts += ["".join(buf), (m.group(1),)]
                buf = []
                i = m.end()
            elif c == "}":
                raise ConfigError(file, key, "}} for a literal closing brace", repr(text[max(0, i - 20):i + 1]))
            else:
                buf.append(c)
                i += 1
        parts.append("".join(buf))
        return cls(tuple(p for p in parts if p != ""))

    @property
    def names(self) -> list[str]:
        return [p[0] for p in self.parts if isinstance(p, tuple)]

    def expand(self, values: Mapping[str, str], *, for_systemd: bool = False) -> str:
        """The text with each placeholder replaced; `for_systemd`: each value's `%` doubled, so systemd's
        specifier expansion gives the value back (the template's own `%h`, `%n`... stay specifiers)."""
        def value(name: str) -> str:
            v = values[name]
            return v.replace("%", "%%") if for_systemd else v

        return "".join(p if isinstance(p, str) else value(p[0]) for p in self.parts)


def text_of(v: Scalar) -> str:
    """A value as it is written into a drop-in or command: TOML's spelling for booleans."""
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


@dataclass(frozen=True)
class Point:
    index: int  # 1-based, in plan order (a baseline run's: past the plan's points)
    values: tuple[tuple[str, Scalar], ...]
    baseline: int = 0  # a run of the `baseline` configuration: its round (1, 2, ...); 0 for a plan point
    aa: int = 0  # a load of the A/A start (`noise_check`, sweep/run/noisecheck.py): which (1, 2, ...); else 0

    def as_dict(self) -> dict[str, Scalar]:
        return dict(self.values)

    @property
    def label(self) -> str:
        words = " ".join(f"{k}={text_of(v)}" for k, v in self.values) or "(no values)"
        if self.aa:
            return f"a/a#{self.aa} {words}"
        return f"baseline#{self.baseline} {words}" if self.baseline else words

    def slug(self, width: int) -> str:
        words = "_".join(f"{k}={text_of(v)}" for k, v in self.values)
        if self.baseline:
            words = f"baseline{self.baseline}_" + words
        if self.aa:
            words = f"aa{self.aa}_" + words
        return f"{self.index:0{width}d}-" + re.sub(r"[^A-Za-z0-9._=+-]", "_", words)[:100]


@dataclass(frozen=True)
class Plan:
    path: str
    target: str | None
    command: tuple[Template, ...]  # one template per word
    dropin: Template | None
    timeout: float | None
    attempts: int
    points: tuple[Point, ...]
    between_points: Between  # what a reused instance gets before each run
    warmup: int | str  # requests sent before each run, not counted; or STABLE: until the medians settle
    repeats: int  # runs per point on the same instance
    noise_limit: float  # a point whose relative MAD over its repeats exceeds this is noisy
    max_divergence: float  # a point diverging early from the baseline on more prompts than this is marked
    warmup_window: int  # warmup = "stable": its windows, tolerance and bounds (convergence.Rule)
    warmup_tolerance: float
    warmup_max: int
    warmup_max_seconds: float
    max_failed_starts: int  # failed starts in a row that stop the sweep
    stray_wait: float  # seconds to wait for GPU strays to exit before a load or a run (sweep/run/strays.py)
    baseline: Baseline | None = None  # the configuration speedups are measured against
    baseline_every: int | None = None  # the baseline runs again after every N groups
    prune: tuple[str, ...] = ()  # server-side axes whose larger values need more memory (prune.py)
    given: frozenset[str] = frozenset()  # the keys the plan file sets (the others have their defaults)
    expect: tuple[tuple[str, Template], ...] = ()  # engine key -> what it must report (sweep/run/confirm.py)
    search: sweepsearch.SearchSpec | None = None  # the load search run per configuration (sweep/run/searchrun.py)
    gpus: int = 1  # GPUs per server configuration: each results line's `gpus` (the report's tokens/s per GPU)
    slo: tuple[SloPart, ...] = ()  # the latency target the report's Decision judges points by (report/decision.py)
    budget: float | None = None  # seconds the sweep may take: it loads nothing it expects to overrun (budget.py)
    strategy: str = sweepexplore.GRID  # which configurations load: all, or a search's (sweep/explore.py)
    start: tuple[tuple[str, Scalar], ...] | None = None  # the search's first configuration (None: the middle)
    audit: int = 0  # configurations a search then loads at random
    audit_seed: int = 0
    min_gain: float = 0.02  # a search's best moves only for more than this
    reloads: int = sweepexplore.RELOADS  # loads again of a search's close contenders (explore.py)
    max_repeats: int = 8  # repeats = "auto": the cap (then `repeats` is this too: the most runs a point gets)
    noise_check: int = 0  # loads of the A/A start (sweep/run/noisecheck.py); 0: none
    repeats_auto: bool = False  # repeats = "auto" (sweep/run/autorepeat.py)

    @property
    def server_axes(self) -> tuple[str, ...]:
        """The axes the drop-in uses: the ones that change what is loaded."""
        return tuple(dict.fromkeys(n for n in self.dropin.names if n != "out")) if self.dropin else ()

    @property
    def stable(self) -> bool:
        return self.warmup == STABLE

    def command_for(self, point: Point, out: str, search_args: Sequence[str] | None = None) -> list[str]:
        """The point's command; with a [search], its word `{search}` replaced by a step's bench flags
        (`search_args`), or left as written without them (the fingerprint, --dry-run)."""
        values = {k: text_of(v) for k, v in point.values} | {"out": out}
        words: list[str] = []
        for w in self.command:
            if self.search is not None and w.parts == (SEARCH_WORD,):
                words += list(search_args) if search_args is not None else ["{search}"]
            else:
                words.append(w.expand(values))
        return words

    def dropin_for(self, point: Point, out: str) -> str | None:
        template = self.baseline.dropin if point.baseline and self.baseline and self.baseline.dropin else self.dropin
        if template is None:
            return None
        text = template.expand({k: text_of(v) for k, v in point.values} | {"out": out}, for_systemd=True)
        return text if text.endswith("\n") else text + "\n"

    def expect_for(self, point: Point) -> dict[str, str]:
        """The plan's `expect` for `point`: engine key -> the value its engine must report."""
        values = {k: text_of(v) for k, v in point.values}
        return {k: t.expand(values) for k, t in self.expect}

    def groups(self) -> list[tuple[Point, ...]]:
        """The server configurations: points whose rendered drop-ins are byte-identical, one group each.

        Groups come in the order of their first point, and keep the plan's order inside. A drop-in
        that uses `{out}` differs for every point (each has its own folder): one point per group.
        Without a drop-in every point runs on the unit's own configuration: one group. With `prune`, groups
        with smaller values on its axes come first (_smaller_first)."""
        by_text: dict[str, list[Point]] = {}
        for p in self.points:
            key = str(p.index) if self.dropin is not None and "out" in self.dropin.names else \
                self.dropin_for(p, "") or ""
            by_text.setdefault(key, []).append(p)
        return _smaller_first([tuple(g) for g in by_text.values()], self.prune)


@dataclass(frozen=True)
class Baseline:
    """The `baseline` key: server-side values for the plan's drop-in, or a drop-in of its own."""

    values: tuple[tuple[str, Scalar], ...]
    dropin: Template | None


def _scalar(file: str, key: str, v: object) -> Scalar:
    if isinstance(v, str):
        if any(ord(c) < 32 for c in v):
            raise ConfigError(file, key, "a value on one line (it is written into a unit file)", repr(v))
        return v
    if isinstance(v, float) and not math.isfinite(v):
        # TOML's inf/nan, or 1e309: a server flag of "inf" is rarely meant, and nan != nan, so a nan
        # point would never be found ok again by --resume.
        raise ConfigError(file, key, "a finite number", repr(v))
    if isinstance(v, bool | int | float):
        return v
    raise ConfigError(file, key, "a string, number or boolean", found_words(v))


def _name(file: str, key: str, name: str) -> str:
    if not _NAME.fullmatch(name) or name == "out":
        raise ConfigError(file, key, "a name of letters, digits and _ (not 'out', which is the point's folder)",
                          repr(name))
    return name


def parse_plan(data: Mapping[str, Any], file: str = "<plan>") -> Plan:
    """Validate a decoded PLAN.toml, or raise ConfigError naming file, key, expected and found."""
    for key in data:
        if key not in PLAN_KEYS:
            raise ConfigError(file, key, "one of the known keys: " + ", ".join(PLAN_KEYS), f"unknown key {key!r}")
    simple = {k.name: k.value(data, file) for k in KEYS if k.read is not None}

    raw_cmd = data.get("command")
    if isinstance(raw_cmd, str):
        try:
            words = shlex.split(raw_cmd)
        except ValueError as e:
            raise ConfigError(file, "command", "a command line with balanced quotes", str(e)) from None
        where = ["command"] * len(words)
    elif isinstance(raw_cmd, list) and all(isinstance(w, str) for w in raw_cmd):
        words, where = raw_cmd, [f"command[{i}]" for i in range(len(raw_cmd))]
    elif raw_cmd is None:
        raise ConfigError(file, "command", f"a string or a list of strings ({PLAN_KEYS['command'].help})",
                          "nothing (the key is required)")
    else:
        raise ConfigError(file, "command", "a string or a list of strings", found_words(raw_cmd))
    if not words:
        raise ConfigError(file, "command", "a command (at least one word)", "an empty command")
    command = tuple(Template.parse(w, file, k) for w, k in zip(words, where, strict=True))

    dropin = None
    if "dropin" in data:
        text = data["dropin"]
        if not isinstance(text, str):
            raise ConfigError(file, "dropin", "unit file text (a string)", found_words(text))
        first = next((ln.strip() for ln in text.splitlines() if ln.strip() and ln.strip()[0] not in "#;"), "")
        if not first.startswith("["):
            raise ConfigError(file, "dropin", "unit file text beginning with a section such as [Service]",
                              repr(first[:40]) if first else "no settings")
        dropin = Template.parse(text, file, "dropin")

    points = _points(data, file, frozenset(dropin.names) if dropin else frozenset())
    expect = _expect(data, file)
    search = _search(data, file, command, where, points)
    used: dict[str, str] = {}  # placeholder -> the key it appears in
    for tpl, key in [(dropin, "dropin"), *zip(command, where, strict=True),
                     *((t, f"expect.{k}") for k, t in expect)]:
        for name in tpl.names if tpl else []:
            used.setdefault(name, key)
    for p in points:
        for name, key in used.items():
            if name != "out" and not (search and name == "search") and name not in dict(p.values):
                raise ConfigError(file, key, f"a value for {{{name}}} in every point",
                                  f"none in point {p.index} ({p.label})")
    baseline = _baseline(data, file, dropin, command, points)
    server_axes = [n for n in dict.fromkeys(dropin.names) if n != "out"] if dropin else []
    axes = _prune_axes(file, data["prune"], server_axes, points) if "prune" in data else ()
    simple["repeats_auto"] = auto = simple["repeats"] == AUTO
    if auto:
        simple["repeats"] = simple["max_repeats"]  # the most runs a point gets: --resume, folders, the ETA
    elif "max_repeats" in data:
        raise ConfigError(file, "max_repeats", 'repeats = "auto" (its cap)', f"repeats = {simple['repeats']}")
    for key, on, want in (("repeats", auto, "an integer"), ("noise_check", simple["noise_check"], "false")):
        if on and search is not None:  # a search's steps are its runs: neither repeats nor loads of their own
            raise ConfigError(file, key, f"{want} with [search] (its steps are the runs)", found_words(data[key]))
    if simple["warmup_max"] < 2 * simple["warmup_window"]:
        raise ConfigError(file, "warmup_max", f"at least twice warmup_window ({2 * simple['warmup_window']}: two "
                          "windows to compare)", f"integer {simple['warmup_max']}")
    start = sweepexplore.check(data, file, simple["strategy"], server_axes, [p.as_dict() for p in points])
    return Plan(path=file, command=command, dropin=dropin, points=points, prune=axes, given=frozenset(data),
                expect=expect, baseline=baseline, search=search, slo=_slo(data, file), start=start, **simple)


def _prune_axes(file: str, raw: object, server_axes: Sequence[str], points: Sequence[Point]) -> tuple[str, ...]:
    """The plan's `prune` list (prune.py), validated: each a distinct axis of the drop-in (a server-side axis)
    whose values are numbers in every point (a size to compare); else a ConfigError naming file, key,
    expected and found."""
    if not isinstance(raw, list) or not all(isinstance(a, str) for a in raw):
        kind = "array" if isinstance(raw, list) else type(raw).__name__
        raise ConfigError(file, "prune", "an array of axis names, such as [\"draft\", \"topk\"]",
                          f"{kind} {raw!r}"[:80])
    for i, axis in enumerate(raw):
        key = f"prune[{i}]"
        if axis not in server_axes:
            raise ConfigError(file, key, "a server-side axis: one the drop-in uses ("
                              + (", ".join(server_axes) or "the plan has none") + ")", repr(axis)[:80])
        if axis in raw[:i]:
            raise ConfigError(file, key, "each axis once", f"{axis!r} again")
        for p in points:
            v = p.as_dict().get(axis)
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise ConfigError(file, key, "an axis whose values are numbers (sizes that can be ordered) in "
                                  "every point", f"{v!r} in point {p.index} ({p.label})"[:120])
    return tuple(raw)


def _smaller_first(groups: Sequence[tuple[Point, ...]], axes: Sequence[str]) -> list[tuple[Point, ...]]:
    """The groups with smaller values on the pruned axes first (in the order `axes` lists them), the
    plan's order kept between equals: a failed start is met before the configurations it prunes."""
    def size(g: tuple[Point, ...]) -> tuple[float, ...]:
        values = g[0].as_dict()
        return tuple(float(values[a]) for a in axes)  # numbers: _prune_axes
    return sorted(groups, key=size) if axes else list(groups)


def _search(data: Mapping[str, Any], file: str, command: tuple[Template, ...], where: list[str],
            points: tuple[Point, ...]) -> sweepsearch.SearchSpec | None:
    """The plan's `[search]` (search.parse's checks), and a command that can take each step's load: a word
    `{search}` on its own, which the step's bench flags replace; a point value named `search` is refused."""
    if "search" not in data:
        return None
    spec = sweepsearch.parse(data["search"], file)
    alone = [k for t, k in zip(command, where, strict=True) if t.parts == (SEARCH_WORD,)]
    inside = [k for t, k in zip(command, where, strict=True) if "search" in t.names and t.parts != (SEARCH_WORD,)]
    if inside or len(alone) != 1:
        raise ConfigError(file, inside[0] if inside else "command",
                          "one word {search} on its own in the command, where each search step's bench flags go "
                          "(-n, -c, --duration, --request-rate, --slo)",
                          f"{len(alone)} such words" + (" and {search} inside a word" if inside else ""))
    for p in points:
        if "search" in dict(p.values):
            raise ConfigError(file, "matrix.search", "no point value named search (the name of the search "
                              "steps' flags in the command)", f"one in point {p.index} ({p.label})")
    return spec


def _slo(data: Mapping[str, Any], file: str) -> tuple[SloPart, ...]:
    """`slo = { ttft_p99_ms = 500, itl_p50_ms = 40 }`: the parts the bench client's --slo takes (benchload.parse_slo
    defines the names), each a number of milliseconds; () without the key."""
    if "slo" not in data:
        return ()
    table = data["slo"]
    if not isinstance(table, dict) or not table:
        raise ConfigError(file, "slo", PLAN_KEYS["slo"].expected,
                          "an empty table" if table == {} else found_words(table))
    for k, v in table.items():
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < 1e300:  # no inf, nan, 10**400
            raise ConfigError(file, f"slo.{k}", "a number of milliseconds > 0", found_words(v))
        try:
            parse_slo(f"{k}={v!r}")
        except ValueError as e:
            raise ConfigError(file, f"slo.{k}", "a part of the bench client's --slo: METRIC_pNN_ms with METRIC ttft, "
                              f"itl or e2e and 0 < NN <= 100, e.g. ttft_p99_ms ({e})", repr(k)[:80]) from None
    try:
        return parse_slo(",".join(f"{k}={v!r}" for k, v in table.items()))
    except ValueError as e:  # every part fine alone: a figure named twice (ttft_p50_ms and ttft_p99_ms)
        raise ConfigError(file, "slo", "one limit per request figure (ttft, itl, e2e)", str(e)[:120]) from None


def _expect(data: Mapping[str, Any], file: str) -> tuple[tuple[str, Template], ...]:
    """`expect = { ENGINE_KEY = "value or {name}" }`: keys as the engine reports them (dotted for nested ones,
    `speculative_config.method`), values strings or scalars, `{out}` refused (no engine reports a folder)."""
    if "expect" not in data:
        return ()
    table = data["expect"]
    if not isinstance(table, dict) or not table:
        raise ConfigError(file, "expect", "a table of ENGINE_KEY = \"value or {name}\"",
                          "an empty table" if table == {} else found_words(table))
    out = []
    for k, v in table.items():
        key = f"expect.{k}"
        if not k or len(k) > 200 or any(ord(c) < 32 for c in k):
            raise ConfigError(file, key, "an engine key (one line, at most 200 characters)", repr(k)[:80])
        if isinstance(v, dict | list):
            raise ConfigError(file, key, "a string, number or boolean (an engine's flat key: "
                              "speculative_config.method, not a table)", found_words(v))
        tpl = Template.parse(text_of(_scalar(file, key, v)), file, key)
        if "out" in tpl.names:
            raise ConfigError(file, key, "a value of the point's own names ({out} is its folder)", repr(v)[:80])
        out.append((k, tpl))
    return tuple(out)


def _baseline(data: Mapping[str, Any], file: str, dropin: Template | None, command: tuple[Template, ...],
              points: tuple[Point, ...]) -> Baseline | None:
    """The `baseline` table, checked: every placeholder of the drop-in it runs and of the command has a value
    at every client setting; a value the plan's drop-in does not use is a typo (it would change nothing)."""
    if "baseline" not in data:
        if "baseline_every" in data:
            raise ConfigError(file, "baseline_every", "a baseline key to run again", "no baseline")
        return None
    raw = data["baseline"]
    if not isinstance(raw, dict):
        raise ConfigError(file, "baseline", PLAN_KEYS["baseline"].expected, found_words(raw))
    own = None
    if "dropin" in raw:
        if not isinstance(raw["dropin"], str) or not raw["dropin"].lstrip().startswith(("[", "#", ";")):
            raise ConfigError(file, "baseline.dropin", "unit file text beginning with a section such as [Service]",
                              found_words(raw["dropin"]))
        own = Template.parse(raw["dropin"], file, "baseline.dropin")
    values = tuple((_name(file, f"baseline.{k}", k), _scalar(file, f"baseline.{k}", v))
                   for k, v in raw.items() if k != "dropin")
    server = set(dropin.names) - {"out"} if dropin else set()
    if own is None:
        if dropin is None:
            raise ConfigError(file, "baseline", "a dropin of its own (the plan has no drop-in to give values to)",
                              "values only")
        for k, _ in values:
            if k not in server:
                raise ConfigError(file, f"baseline.{k}", "a placeholder of the plan's drop-in: "
                                  + (", ".join(sorted(server)) or "none"), repr(k))
    given = {k for k, _ in values} | ({"search"} if "search" in data else set())  # a step's flags fill {search}
    for p in points[:1]:
        client = {k for k, _ in p.values if k not in server}
        for tpl, key in [(own or dropin, "baseline.dropin" if own else "dropin"), *((w, "command") for w in command)]:
            for name in tpl.names if tpl else []:
                if name != "out" and name not in given | client:
                    raise ConfigError(file, f"baseline.{name}", f"a value for {{{name}}} (used in {key})",
                                      "none in the baseline")
    return Baseline(values, own)


def _points(data: Mapping[str, Any], file: str, dropin_names: frozenset[str]) -> tuple[Point, ...]:
    # Each value with the plan key it came from, so an error names the key (and the point).
    values: list[tuple[tuple[str, Scalar, str], ...]] = []
    if "matrix" in data:
        matrix = data["matrix"]
        if not isinstance(matrix, dict) or not matrix:
            raise ConfigError(file, "matrix", "a table of NAME = [values]", "an empty table" if matrix == {}
                              else found_words(matrix))
        axes: list[list[tuple[str, Scalar, str]]] = []
        for name, vs in matrix.items():
            key = f"matrix.{_name(file, f'matrix.{name}', name)}"
            if not isinstance(vs, list) or not vs:
                raise ConfigError(file, key, "a non-empty array of values", found_words(vs))
            axes.append([(name, _scalar(file, f"{key}[{i}]", v), f"{key}[{i}]") for i, v in enumerate(vs)])
        listed = data.get("points")
        _check_count(file, math.prod(len(a) for a in axes), len(listed) if isinstance(listed, list) else 0)
        values += [tuple(combo) for combo in itertools.product(*axes)]
    if "points" in data:
        pts = data["points"]
        if not isinstance(pts, list) or not pts or not all(isinstance(p, dict) for p in pts):
            raise ConfigError(file, "points", "[[points]] tables of NAME = value", found_words(pts))
        _check_count(file, len(values), len(pts))
        for i, p in enumerate(pts):
            if not p:
                raise ConfigError(file, f"points[{i}]", "at least one NAME = value", "an empty table")
            values.append(tuple((_name(file, f"points[{i}].{k}", k), _scalar(file, f"points[{i}].{k}", v),
                                 f"points[{i}].{k}") for k, v in p.items()))
    if not values:
        raise ConfigError(file, "matrix", "at least one point: a [matrix] table or [[points]] tables", "none")
    points = tuple(Point(i, tuple((n, v) for n, v, _ in vs)) for i, vs in enumerate(values, 1))
    seen: dict[str, int] = {}
    for p, vs in zip(points, values, strict=True):
        for name, v, key in vs:
            if name in dropin_names and text_of(v).rstrip().endswith("\\"):
                raise ConfigError(file, key, "a value that does not end in \\ (in the drop-in, systemd would join "
                                  "the next line to it)", f"{v!r} in point {p.index} ({p.label})")
        k = json.dumps(p.as_dict(), sort_keys=True)
        if k in seen:
            raise ConfigError(file, "points", "every point once",
                              f"point {p.index} ({p.label}) repeats point {seen[k]}")
        seen[k] = p.index
    return points


def _check_count(file: str, matrix: int, listed: int) -> None:
    if matrix + listed > MAX_POINTS:
        how = " + ".join(f"{n:,} {what}" for n, what in ((matrix, "from [matrix]"), (listed, "[[points]]")) if n)
        raise ConfigError(file, "points" if listed else "matrix", f"at most {MAX_POINTS:,} points",
                          f"{matrix + listed:,} ({how})")


@dataclass(frozen=True)
class Shard:
    """`--shard K/N`: this host runs the groups whose 0-based index is K-1 modulo N."""

    k: int
    n: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        """K/N with 1 <= K <= N; ValueError saying what is expected otherwise."""
        k_s, sep, n_s = text.partition("/")
        try:
            k, n = int(k_s), int(n_s)
        except ValueError:
            k = n = 0
        if not sep or not 1 <= k <= n:
            raise ValueError(f"--shard: expected K/N with 1 <= K <= N (e.g. 1/4), found {text!r}")
        return cls(k, n)

    def take(self, groups: list[tuple[Point, ...]]) -> list[tuple[Point, ...]]:
        # Whole groups go to one host, so no server configuration is loaded on two hosts.
        return groups[self.k - 1::self.n]

    def __str__(self) -> str:
        return f"{self.k}/{self.n}"


def load_plan(path: Path) -> Plan:
    return parse_plan(read_toml(path, MAX_PLAN_BYTES), str(path))
