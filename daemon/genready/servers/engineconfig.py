"""What the engine says it runs, read back and compared with the flags systemd starts it with (issue 38 §2).

A drop-in's flag can be misspelled, ignored, overridden by a later one, or the engine can fall back
on its own: the server then starts, generates, is verified, and a sweep point measures another
configuration than its plan says. After verification, and before the run, each kind's own report
of its configuration is read (`EngineRead` on the ServerKind, each route and key named from the
server's source), flattened to `key: scalar`, and compared with the values its ExecStart= argv sets
through the kind's flag map:

- a value the engine reports otherwise is a `Mismatch` (flag, key, expected, reported);
- a value it does not report at all is `unconfirmed`, named, never silently passed.

`verdict` is the sweep's decision on that (and on the plan's `expect`): `config_mismatch` points are
recorded, not run, not retried. Every read is bounded: the answers by the caller's `Call` (size and
time), the vLLM log line by `parse_args_line`'s literal parse (size, nodes, depth; never eval).
"""

from __future__ import annotations

import ast
import asyncio
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from genready.redact import MASK, secret_name
from genready.servers.argv import read_argv
from genready.servers.flush import Call

Scalar = str | int | float | bool | None

UNCONFIRMED: Final = "unconfirmed"
CONFIG_MISMATCH: Final = "config_mismatch"  # a results line's status: the engine runs something else
NO_DRAFTING: Final = "no_drafting"  # speculative per its config, yet nothing was drafted
# A route that answers one of these (or nothing) is asked again after each pause: an engine busy or settling for a
# moment (a 503 under a warmup's last requests) is not one that reports no configuration, and a failed read made
# every point of its loaded configuration config_mismatch ("reports KEY=None"; issue 53 #9).
RETRY_STATUSES: Final = frozenset({0, 429, 502, 503, 504})
RETRY_PAUSES: Final = (0.25, 0.5, 1.0)
MAX_KEYS: Final = 2000  # keys kept of one engine's report (SGLang's server args are ~400)
MAX_VALUE: Final = 512  # characters kept of one reported string (a chat template is not a setting)
# The literal parse of a log line (vLLM's non-default args): its size, its nodes and its nesting.
MAX_LITERAL: Final = 64 << 10
MAX_NODES: Final = 20_000
MAX_DEPTH: Final = 24


class NotLiteral(ValueError):
    """The text is no bounded Python literal (too big, too deep, too many nodes, or not a literal)."""


# --- the bounded literal parse -----------------------------------------------------------------------------

def _outside_quotes(text: str) -> Iterator[tuple[int, int]]:
    """(index, bracket depth after it) of each character of `text` outside quotes: the one scanner of both
    the depth pre-check and the split of a dict's repr into items."""
    depth, quote, i = 0, "", 0
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        else:
            if c in "([{":
                depth += 1
            elif c in ")]}":
                depth -= 1
            yield i, depth
        i += 1


def _depth(text: str) -> int:
    """The deepest bracket nesting outside quotes (a pre-check: the parser recurses on nesting)."""
    return max([0, *(depth for _, depth in _outside_quotes(text))])


def literal(text: str) -> Any:
    """A Python literal (dict, list, tuple, str, number, True/False/None) from `text`, bounded by MAX_LITERAL
    characters, MAX_DEPTH nesting and MAX_NODES syntax nodes; NotLiteral otherwise. Never evaluates code."""
    if len(text) > MAX_LITERAL:
        raise NotLiteral(f"{len(text):,} characters, over the {MAX_LITERAL:,} a literal may have")
    if _depth(text) > MAX_DEPTH:
        raise NotLiteral(f"nested deeper than {MAX_DEPTH}")
    try:
        tree = ast.parse(text.strip(), mode="eval")
        nodes = sum(1 for _ in ast.walk(tree))
        if nodes > MAX_NODES:
            raise NotLiteral(f"{nodes:,} syntax nodes, over {MAX_NODES:,}")
        return ast.literal_eval(tree)
    except NotLiteral:
        raise
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError) as e:
        raise NotLiteral(f"not a literal ({type(e).__name__})") from None


def _split_top(text: str, sep: str) -> list[str]:
    """`text` split at `sep` where no bracket or quote is open (the items of a dict's repr)."""
    cuts = [i for i, depth in _outside_quotes(text) if depth == 0 and text[i] == sep]
    return [text[a + 1:b] for a, b in zip([-1, *cuts], [*cuts, len(text)], strict=True)]


def dict_repr(text: str) -> dict[str, Any]:
    """A dict from its repr: whole when it is one bounded literal; else item by item, so that a value that is
    no literal (a masked `***`, an object's repr, a line cut short) spoils only itself: it is kept as its
    text, and an item cut off at the end is left out."""
    text = text.strip()
    try:
        whole = literal(text)
    except NotLiteral:
        whole = None
    if isinstance(whole, dict):
        return {str(k): v for k, v in whole.items()}
    if len(text) > MAX_LITERAL or not text.startswith("{"):
        raise NotLiteral("not a dict's repr" if len(text) <= MAX_LITERAL else
                         f"{len(text):,} characters, over the {MAX_LITERAL:,} a literal may have")
    closed = text.endswith("}") and _depth(text) >= 1
    items = _split_top(text[1:-1] if closed else text[1:], ",")
    if not closed:
        items = items[:-1]  # cut mid-item: what is left of the last one is not its value
    out: dict[str, Any] = {}
    for item in items[:MAX_KEYS]:
        parts = _split_top(item, ":")
        if len(parts) < 2:
            continue
        try:
            key = literal(parts[0])
        except NotLiteral:
            continue
        raw = ":".join(parts[1:]).strip()
        try:
            out[str(key)] = literal(raw)
        except NotLiteral:
            out[str(key)] = raw[:MAX_VALUE]
    return out


# --- flattening and redaction ------------------------------------------------------------------------------

def flatten(doc: Mapping[str, Any], prefix: str = "", depth: int = 3) -> dict[str, Scalar]:
    """`{a: {b: 1}}` -> `{"a.b": 1}` to `depth` levels; lists of scalars joined by ","; lists of lists of numbers
    as their compact JSON (`[[1,8,3],[9,64,1]]`); other lists, and what lies deeper, left out. At most MAX_KEYS
    keys; strings cut at MAX_VALUE."""
    out: dict[str, Scalar] = {}
    for k, v in doc.items():
        if len(out) >= MAX_KEYS:
            break
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            if depth > 1:
                out.update(flatten(v, key + ".", depth - 1))
        elif isinstance(v, list | tuple):
            if all(isinstance(x, str | int | float | bool) for x in v):
                out[key] = ",".join(str(x) for x in v)[:MAX_VALUE]
            elif all(isinstance(x, list | tuple) and all(isinstance(y, int | float) for y in x) for x in v):
                # a table of numbers (vLLM's num_speculative_tokens_per_batch_size): its compact JSON, both sides
                out[key] = json.dumps([list(x) for x in v], separators=(",", ":"))[:MAX_VALUE]
        elif isinstance(v, str):
            out[key] = v[:MAX_VALUE]
        elif v is None or isinstance(v, bool | int | float):
            out[key] = v
    return out


def redacted(config: Mapping[str, Scalar]) -> dict[str, Scalar]:
    """The config fit to record: a secret-named key's value (api_key, hf_token, …) is MASK when set."""
    return {k: (MASK if v not in (None, "") and secret_name(k.rsplit(".", 1)[-1]) else v) for k, v in config.items()}


# --- each kind's report, as its source has it --------------------------------------------------------------

def sglang_info(route: str, body: bytes) -> dict[str, Scalar]:
    # python/sglang/srt/entrypoints/http_server.py, get_server_info / server_info: {**asdict(server_args),
    # **scheduler_info, "internal_states": [...], "version"}: the tokenizer manager's ServerArgs after
    # __post_init__ (speculative_algorithm NEXTN already EAGLE), flat; internal_states is per DP rank.
    doc = json.loads(body)
    if not isinstance(doc, dict):
        raise ValueError(f"{route} is not a JSON object")
    return flatten({k: v for k, v in doc.items() if k != "internal_states"}, depth=2)


def llamacpp_props(route: str, body: bytes) -> dict[str, Scalar]:
    # tools/server/server-context.cpp, get_res_props: model_path, total_slots (-np), model_alias, build_info,
    # and default_generation_settings {params, n_ctx}. Its params are a default task's (only the sampling is
    # copied from the server's): their speculative.* do not reflect the flags (see SPEC_FROM_SLOTS).
    doc = json.loads(body)
    if not isinstance(doc, dict):
        raise ValueError(f"{route} is not a JSON object")
    keep = {k: doc[k] for k in ("model_path", "total_slots", "model_alias", "build_info") if k in doc}
    dgs = doc.get("default_generation_settings")
    if isinstance(dgs, dict) and "n_ctx" in dgs:
        keep["n_ctx_slot"] = dgs["n_ctx"]
    return flatten(keep)


def llamacpp_slots(route: str, body: bytes) -> dict[str, Scalar]:
    # tools/server/server-context.cpp, server_slot::to_json: each slot's "speculative" (a speculator exists:
    # can_speculate) and, once it served a task, that task's "params": task_params::to_json
    # (tools/server/server-task.cpp), whose speculative defaults are the server's params_base.speculative:
    # build 11434 reports only "speculative.types" ("none,draft-simple"); older builds "speculative.n_max",
    # "speculative.n_min", "speculative.p_min". The verification's generation has run by now.
    doc = json.loads(body)
    if not isinstance(doc, list):
        raise ValueError(f"{route} is not a JSON list")
    slots = [s for s in doc if isinstance(s, dict)]
    out: dict[str, Scalar] = {}
    if slots and isinstance(slots[0].get("speculative"), bool):
        out["speculative"] = slots[0]["speculative"]
    served: dict[str, Any] = next((s["params"] for s in slots if isinstance(s.get("params"), dict)), {})
    out.update({k: v for k, v in flatten(served, depth=1).items() if k.startswith("speculative.")})
    return out


ARGS_MARK: Final = "non-default args: "


def vllm_args_line(line: str) -> dict[str, Scalar]:
    # vllm/entrypoints/serve/utils/api_utils.py (older: vllm/entrypoints/utils.py, openai/cli_args.py),
    # log_non_default_args: logger.info("non-default args: %s", dict): the argparse dests whose values
    # differ from the defaults, as a dict's repr (api_key "***" in newer versions; genready masks it too).
    at = line.find(ARGS_MARK)
    if at < 0:
        raise NotLiteral(f"no {ARGS_MARK.strip()!r} in the line")
    return flatten(dict_repr(line[at + len(ARGS_MARK):]), depth=3)


def metrics_info(text: str) -> dict[str, Scalar]:
    """Every `NAME_info{labels} 1` gauge of a /metrics page as `NAME.label: value` (vLLM's
    vllm:cache_config_info, TensorRT-LLM's trtllm_speculative_config_info); each line read to 8 KiB."""
    out: dict[str, Scalar] = {}
    for line in text.splitlines():
        if line.startswith("#") or "_info{" not in line[:200] or len(out) >= MAX_KEYS:
            continue
        name, _, rest = line[:8192].partition("{")
        labels, _, _ = rest.rpartition("}")
        for item in _split_top(labels, ","):
            k, eq, v = item.partition("=")
            if eq and len(v) >= 2 and v[0] == v[-1] == '"':
                out[f"{name.strip()}.{k.strip()}"] = v[1:-1][:MAX_VALUE]
    return out


@dataclass(frozen=True)
class EngineRead:
    """How one kind says what it runs, and which flags set which of its keys."""

    routes: tuple[tuple[str, Callable[[str, bytes], dict[str, Scalar]]], ...] = ()  # each read; the first
    # of a group of alternatives (same parser) that answers 200 wins
    args_line: Callable[[str], dict[str, Scalar]] | None = None  # a line of its start's output (vLLM)
    args_mark: str = ""  # what that line holds
    metrics_info: str = ""  # the route of its Prometheus page with *_info gauges ("": none)
    flags: Mapping[str, str] = field(default_factory=dict)  # command-line flag -> the engine's key
    positional: str = ""  # the key its first positional argument sets (vLLM's model_tag)
    json_flags: frozenset[str] = frozenset()  # flags whose value is a JSON object: compared key by key
    append: Mapping[str, str] = field(default_factory=dict)  # flag -> default of a value that accumulates
    same: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # key -> {flag's value: what it runs as}


# --- what the argv says, and how it compares -------------------------------------------------------------

def expected(read: EngineRead, args: Sequence[str]) -> dict[str, tuple[str, str]]:
    """key -> (flag, value) that `args` (the server's arguments, after its program) sets, as the server
    parses them (servers/argv.py, the reader `init` uses too): the last of a repeated flag wins; an accumulating
    flag joins its values after its default; a JSON flag's object gives one key per member
    (`speculative_config.method`)."""
    found = read_argv(args, read.flags, positional=bool(read.positional))
    out: dict[str, tuple[str, str]] = {}
    if found.positional:
        out[read.positional] = ("(positional)", found.positional)
    for flag, value in found.given:
        key = read.flags[flag]
        if flag in read.append:
            before = out.get(key, (flag, read.append[flag]))[1]
            value = ",".join(x for x in (before, value) if x)
        doc = _json(value) if flag in read.json_flags else None
        if isinstance(doc, dict):
            for k, v in flatten(doc, key + ".").items():
                out[k] = (flag, _text(v))
        else:
            out[key] = (flag, value)
    return out


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _text(v: Scalar) -> str:
    return "" if v is None else (str(v).lower() if isinstance(v, bool) else str(v))


def same_value(want: str, got: Scalar) -> bool:
    """Whether a flag's text and a reported value are one setting: numbers by value, booleans by truth,
    strings exactly."""
    if got is None:
        return want.strip().lower() in ("", "none", "null")
    if isinstance(got, bool):
        return want.strip().lower() in (("true", "1", "yes") if got else ("false", "0", "no"))
    if isinstance(got, int | float):
        try:
            return math.isclose(float(want), float(got), rel_tol=1e-6, abs_tol=1e-9)
        except ValueError:
            return False
        except OverflowError:  # an integer beyond any float (`1` and 400 zeros): equal only as written
            return want.strip() == str(got)
    return want == got


@dataclass(frozen=True)
class Mismatch:
    flag: str
    key: str
    expected: str
    reported: Scalar

    def words(self) -> str:
        return f"{self.flag} {self.expected} but the engine reports {self.key}={self.reported!r}"


@dataclass(frozen=True)
class Confirmation:
    """How the engine's report compares with what its flags (and the plan's `expect`) set."""

    confirmed: dict[str, Scalar] = field(default_factory=dict)
    mismatches: tuple[Mismatch, ...] = ()
    unconfirmed: tuple[tuple[str, str, str], ...] = ()  # (flag, key, expected): the engine does not report it

    def to_json(self) -> dict[str, Any]:
        return {"confirmed": sorted(self.confirmed),
                "mismatches": [{"flag": m.flag, "key": m.key, "expected": m.expected, "reported": m.reported}
                               for m in self.mismatches],
                UNCONFIRMED: [{"flag": f, "key": k, "expected": v} for f, k, v in self.unconfirmed]}


def compare(read: EngineRead, want: Mapping[str, tuple[str, str]], reported: Mapping[str, Scalar]) -> Confirmation:
    """Each expected key against the report: confirmed, a Mismatch, or unconfirmed (not reported)."""
    confirmed: dict[str, Scalar] = {}
    mismatches: list[Mismatch] = []
    unconfirmed: list[tuple[str, str, str]] = []
    for key, (flag, value) in sorted(want.items()):
        if key not in reported:
            unconfirmed.append((flag, key, value))
            continue
        got = reported[key]
        runs_as = read.same.get(key, {}).get(value, value)
        if same_value(runs_as, got):
            confirmed[key] = got
        else:
            mismatches.append(Mismatch(flag, key, value, got))
    return Confirmation(confirmed, tuple(mismatches), tuple(unconfirmed))


def with_expect(conf: Confirmation, expect: Mapping[str, str], reported: Mapping[str, Scalar]) -> Confirmation:
    """`conf` plus the plan's `expect` (engine key -> the point's value). A key the plan expects that the
    engine does not report is a mismatch (reported None): it was asked for by name, and a misspelled key
    must not pass as confirmed."""
    confirmed, mismatches = dict(conf.confirmed), list(conf.mismatches)
    for key, value in sorted(expect.items()):
        got = reported.get(key)
        if key in reported and same_value(value, got):
            confirmed[key] = got
        else:
            mismatches.append(Mismatch(f"expect.{key}", key, value, got if key in reported else None))
    return Confirmation(confirmed, tuple(mismatches), conf.unconfirmed)


# --- reading it --------------------------------------------------------------------------------------------

@dataclass
class EngineConfig:
    """What was read: the flat config (redacted), where from, and why a source could not be read."""

    values: dict[str, Scalar] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"values": redacted(self.values), "sources": self.sources, "problems": self.problems}


async def read_engine(read: EngineRead, call: Call, args_line: str | None = None) -> EngineConfig:
    """The engine's report from each of its sources: its routes (GET, through `call`, which bounds size and
    time), the start's args line when the kind has one (found by the caller: `args_mark`), /metrics' *_info."""
    got = EngineConfig()
    groups: dict[Callable[[str, bytes], dict[str, Scalar]], list[str]] = {}
    for route, parse in read.routes:
        groups.setdefault(parse, []).append(route)
    for parse, routes in groups.items():  # alternatives (a route's older name) share a parser: first 200 wins
        answers = []
        for route in routes:
            status, body = await call("GET", route)
            for pause in RETRY_PAUSES:
                if status not in RETRY_STATUSES:
                    break
                await asyncio.sleep(pause)
                status, body = await call("GET", route)
            if status != 200:
                answers.append(f"{route} {status or body.decode('utf-8', 'replace')[:200]}")
                continue
            try:
                got.values.update(parse(route, body))
                got.sources.append(f"GET {route}")
            except (ValueError, UnicodeDecodeError, RecursionError) as e:
                answers.append(f"{route}: {e}")
                continue
            break
        else:
            got.problems.append("GET " + "; ".join(answers))
    if read.args_line is not None:
        if args_line is None:
            got.problems.append(f"no {read.args_mark.strip()!r} line in the start's output")
        else:
            try:
                got.values.update(read.args_line(args_line))
                got.sources.append(f"log line {read.args_mark.strip()!r}")
            except NotLiteral as e:
                got.problems.append(f"the {read.args_mark.strip()!r} line: {e}")
    if read.metrics_info:
        status, body = await call("GET", read.metrics_info)
        if status == 200 and (info := metrics_info(body.decode("utf-8", "replace"))):
            got.values.update(info)
            got.sources.append(f"GET {read.metrics_info} *_info")
    return got


# --- the sweep's decision ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Verdict:
    """What the sweep does with a point after reading its engine: `status` None runs it; otherwise it is
    recorded with that status and `reason`, not run and not retried (its start would report the same)."""

    status: str | None
    reason: str = ""
    warnings: tuple[str, ...] = ()


def verdict(conf: Confirmation) -> Verdict:
    """config_mismatch when the engine reports another value for any flag or expected key; else run, with a
    warning naming what could not be confirmed."""
    warn: tuple[str, ...] = ()
    if conf.unconfirmed:
        warn = (f"not confirmed by the engine (it does not report them): "
                f"{', '.join(f'{f} {v}' for f, _, v in conf.unconfirmed[:8])}",)
    if conf.mismatches:
        return Verdict(CONFIG_MISMATCH, "; ".join(m.words() for m in conf.mismatches[:6]), warn)
    return Verdict(None, "", warn)


def drafting_verdict(speculative: bool, drafted: int | None) -> Verdict:
    """no_drafting for a run on a speculative server (per its config, or the plan's expect) whose answers and
    counters show no draft token at all; `drafted` None: no source counted drafts, so nothing is said."""
    if speculative and drafted == 0:
        return Verdict(NO_DRAFTING, "the server is speculative but drafted no token in the whole run")
    return Verdict(None)


def speculative(config: Mapping[str, Scalar]) -> bool:
    """Whether an engine's report says it drafts: SGLang's speculative_algorithm, vLLM's speculative_config,
    llama-server's slot `speculative`."""
    if config.get("speculative") is True:
        return True
    if config.get("speculative_algorithm") not in (None, "", "None"):
        return True
    return any(k.startswith("speculative_config.") and v not in (None, "") for k, v in config.items())


def differing_keys(configs: Iterable[Mapping[str, Scalar]]) -> list[str]:
    """The keys whose values differ across points' engine configs (a key missing from one differs too)."""
    configs = list(configs)
    keys = sorted({k for c in configs for k in c})
    return [k for k in keys if len({json.dumps(c.get(k, "\0absent")) for c in configs}) > 1]


def identical_configs(points: Sequence[tuple[str, Mapping[str, Scalar], Mapping[str, Scalar]]]) -> list[str]:
    """Warnings for pairs of points (label, server values, engine config) whose server values differ but whose
    engine configs are identical: without `expect`, the one sign a flag did not take."""
    out = []
    for i, (la, sa, ca) in enumerate(points):
        for lb, sb, cb in points[i + 1:]:
            if dict(sa) != dict(sb) and ca and dict(ca) == dict(cb):
                out.append(f"{la} and {lb} differ in their server values but their engines report the same "
                           "configuration: a flag may not have taken (set `expect` to check)")
    return out
