"""A plan's `[search]` (issue 39 §2) against llama.cpp's real llama-server: a saturation search and an slo search,
each on the one instance its configuration loads, every step a verified run of the bench client.

The server is the one `./dev` builds and caches (genready_dev.realservers), the model the tiny seeded GGUF file
of genready_dev.gguf_models: these tests check the search's loop on a real server (one load, each step verified
and bounded), never its speed. Skipped when the server is not built (a failure under CI=true).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from genready.sweep.files import SEARCH_FILE
from genready.sweep.run import searchrun
from genready_dev import gguf_models, realservers
from genready_dev.harness import GENREADY, PY, Genready, free_port, wait_for
from genready_dev.usermanager import UserManager
from tests import ci

UNIT = "llama-search.service"
FAST = {"backoff_initial": 0.05, "backoff_max": 0.3, "probe_timeout": 5.0}
# One thread, no memory mapping, /metrics (test_llama_spec.py's reasons); the slots come from the drop-in.
SERVER_FLAGS = "-c 2048 -lm none --metrics -t 1 -tb 1"
PROMPTS = ["The quick brown fox", "Once upon a time,", "def fibonacci(n):"]
# Few, short steps: at most 6 requests of 8 tokens, at most 5 s each, at most 2 in flight.
BOUNDS = {"max_requests_per_step": 6, "max_step_seconds": 5, "max_concurrency": 2}


class SearchRig:
    """llama-server as a unit of the private user manager, a genready verifying its starts, and a search plan
    whose drop-in gives the server its slots (so the sweep loads it once, with the drop-in)."""

    def __init__(self, manager: UserManager, tmp: Path) -> None:
        for what in ("llama-server", "gguf"):
            ci.require(realservers.missing(what), "a search on llama-server")
        self.manager, self.tmp = manager, tmp
        self.llama = realservers.llama_server()
        self.model = gguf_models.ensure("tiny")["tiny"]
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        manager.install_unit(UNIT, f"""[Unit]
StartLimitIntervalSec=0
[Service]
ExecStart={self.llama} -m {self.model} --host 127.0.0.1 --port {self.port} -np 1 {SERVER_FLAGS}
TimeoutStopSec=10
StandardError=append:{tmp / 'llama.log'}
StandardOutput=append:{tmp / 'llama.log'}
""")
        manager.systemctl("start", UNIT)
        self.g = Genready(manager, tmp, {"llama": {"unit": UNIT, "url": self.url, "api": "openai-completions",
                                                   **FAST}}).start()
        wait_for(lambda: self.g.get("/ready/llama")[0] == 200, 30, "the unit's first start verified")
        self.dataset = tmp / "prompts.jsonl"
        self.dataset.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))

    def run(self, name: str, search: dict[str, Any]) -> Path:
        """The sweep of a plan with this `[search]`, into its own results folder; it must exit 0."""
        plan = self.tmp / f"{name}.toml"
        plan.write_text(tomli_w.dumps({
            "target": "llama", "timeout": 120, "warmup": 0,
            "command": [PY, "-m", "genready.benchclient", "--url", self.url, "--api", "openai-completions",
                        "--max-tokens", "8", "--temperature", "0", "--seed", "1", "--dataset", str(self.dataset),
                        "--output", "{out}/bench.jsonl", "{search}"],
            "dropin": f"[Service]\nExecStart=\nExecStart={self.llama} -m {self.model} --host 127.0.0.1 "
                      f"--port {self.port} -np {{slots}} {SERVER_FLAGS}\n",
            "matrix": {"slots": [2]}, "search": {**BOUNDS, **search}}))
        results = self.tmp / name
        p = subprocess.run([*GENREADY, "sweep", str(plan), "--results", str(results), "--config",
                            str(self.g.config_path)], env=self.manager.env, capture_output=True, text=True,
                           timeout=300)
        print(p.stdout, p.stderr[-3000:])
        assert p.returncode == 0, p.stdout + p.stderr
        return results

    def close(self) -> None:
        self.g.stop()
        self.manager.systemctl("stop", UNIT, check=False)
        self.manager.systemctl("reset-failed", UNIT, check=False)
        self.manager.remove_unit(UNIT)


@pytest.fixture
def rig(manager: UserManager, tmp_path: Path) -> Iterator[SearchRig]:
    r = SearchRig(manager, tmp_path)
    yield r
    r.close()


def steps_of(results: Path) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Each step's results line and its bench line."""
    out = []
    for line in (results / "results.jsonl").read_text().splitlines():
        rec = json.loads(line)
        bench = searchrun.bench_line(results, rec)
        assert bench is not None, rec
        out.append((rec, bench))
    return out


def assert_one_verified_load(results: Path) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Every step ok on the one instance the sweep loaded and verified, its bench client served by that PID,
    within the step's bounds."""
    steps = steps_of(results)
    assert [r["search_step"] for r, _ in steps] == list(range(1, len(steps) + 1))
    assert len({r["invocation_id"] for r, _ in steps}) == 1, steps  # one load for the whole search
    for rec, bench in steps:
        assert rec["status"] == "ok" and rec["invocation_id"] and rec["pid"], rec
        assert bench["served_by"]["pid"] == str(rec["pid"]), bench["served_by"]  # verified: this instance served
        assert bench["requests"] <= BOUNDS["max_requests_per_step"] and bench["failed"] == 0, bench
    assert steps[0][0]["restarted"] and not any(r["restarted"] for r, _ in steps[1:])
    return steps


@pytest.mark.system
def test_a_saturation_search_and_an_slo_search_on_llama_server(rig: SearchRig) -> None:
    sat = rig.run("saturation", {"mode": "saturation", "steps": 1})
    steps = assert_one_verified_load(sat)
    assert [r["search_kind"] for r, _ in steps][:2] == ["synchronous", "throughput"]
    # A rate step runs only when two in flight achieved more than one at a time: with one thread on a shared
    # machine, the tiny model's two slots may not (search.rates_between: no room between the two rates).
    sync, through = (b["requests_per_second"] for _, b in steps[:2])
    assert len(steps) == (3 if through > sync else 2), (sync, through)
    (found,) = [json.loads(ln) for ln in (sat / SEARCH_FILE).read_text().splitlines()]
    assert found["complete"] and found["steps"] == len(steps)
    assert (found["first_saturated_rate"] is not None) == (len(steps) == 3)
    assert found["crossover_status"] == "no_baseline" and len(found["curve"]) == len(steps)

    slo = rig.run("slo", {"mode": "slo", "axis": "concurrency", "slo": "e2e_p99_ms=60000", "start": 1,
                          "max_steps": 2})
    steps = assert_one_verified_load(slo)
    assert [(r["search_kind"], r["search_concurrency"]) for r, _ in steps] == [("bracket", 1), ("bracket", 2)]
    assert all(b["slo_met"] is True for _, b in steps), [b.get("slo_met") for _, b in steps]
    (found,) = [json.loads(ln) for ln in (slo / SEARCH_FILE).read_text().splitlines()]
    assert found["complete"] and found["max_rate_under_slo"] == 2  # on the concurrency axis: the most in flight
