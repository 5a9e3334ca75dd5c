"""Between a sweep's runs: the flush of the server's prefix cache, the warmup, repeats and their spread.

The flush routes are checked against the simulator's profiles (each imitates its server's route, from
its source) and against the real llama-server where it is built; the bias itself is measured: in a
group on the simulator's prefix cache, a reused point's TTFT is lower without a flush than with one.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from genready import config
from genready.config import ConfigError, TargetConfig
from genready.exitcodes import Failed
from genready.servers import metricspage
from genready.sweep import plan as sweepplan
from genready.sweep.report import collect
from genready.sweep.report import table as sweepreport
from genready.sweep.report.main import report_main
from genready.sweep.run import results as sweepresults
from genready.tools import servercache, servermetrics
from genready_dev import gguf_models, realservers
from genready_dev.harness import PY, LlamaServer, Simulator, http, wait_for
from genready_dev.usermanager import UserManager
from tests import ci
from tests.test_sweep import Rig

# --- the plan's keys ---------------------------------------------------------------------------------


def plan(text: str) -> sweepplan.Plan:
    from genready.compat import tomllib
    return sweepplan.parse_plan(tomllib.loads(text), "plan.toml")


def test_the_new_plan_keys_have_the_issues_defaults_and_refuse_bad_values() -> None:
    p = plan('command = "x"\n[matrix]\na = [1]\n')
    # issue 38: the default warmup is "stable" (it was 2)
    assert (p.between_points, p.warmup, p.repeats, p.noise_limit) == ("flush", "stable", 1, 0.10)
    p = plan('command = "x"\nbetween_points = "none"\nwarmup = 0\nrepeats = 3\nnoise_limit = 0.2\n[matrix]\na = [1]\n')
    assert (p.between_points, p.warmup, p.repeats, p.noise_limit) == ("none", 0, 3, 0.2)
    for bad, key in (('between_points = "clear"', "between_points"), ("warmup = -1", "warmup"),
                     ("repeats = 0", "repeats"), ("repeats = true", "repeats"), ('noise_limit = "10%"', "noise_limit"),
                     ("noise_limit = -0.1", "noise_limit")):
        with pytest.raises(ConfigError) as e:
            plan(f'command = "x"\n{bad}\n[matrix]\na = [1]\n')
        assert e.value.key == key and "plan.toml" in str(e.value), (bad, str(e.value))


# --- repeats: medians, spread, noise, --resume ------------------------------------------------------------


def write_results(folder: Path, runs: list[tuple[dict[str, Any], int, str, float | None, str]]) -> None:
    """results.jsonl and each run's bench.jsonl: (point, repeat, status, TTFT p50, cache)."""
    lines = []
    for k, (point, repeat, status, ttft, cache) in enumerate(runs):
        out = f"{point['a']:02d}-a={point['a']}/repeat-{repeat}/attempt-{k}"
        (folder / out).mkdir(parents=True)
        if ttft is not None:
            (folder / out / "bench.jsonl").write_text(json.dumps({"ttft_p50_ms": ttft, "accept_length": 2.0}) + "\n")
        lines.append(json.dumps({"point": point, "index": point["a"], "status": status, "attempt": 1, "out": out,
                                 "repeat": repeat, "cache": cache, "noise_limit": 0.10, "pid": 7}))
    (folder / "results.jsonl").write_text("\n".join(lines) + "\n")


def test_repeats_show_the_median_its_spread_and_a_noisy_mark(tmp_path: Path) -> None:
    write_results(tmp_path, [
        ({"a": 1}, 1, "ok", 10.0, "cold_start"), ({"a": 1}, 2, "ok", 11.0, "flushed"),
        ({"a": 1}, 3, "ok", 10.4, "flushed"),
        ({"a": 2}, 1, "ok", 10.0, "cold_start"), ({"a": 2}, 2, "ok", 20.0, "warm"),
        ({"a": 2}, 3, "invalidated", None, "warm"), ({"a": 2}, 3, "ok", 30.0, "warm")])
    rows = collect.rows_of([tmp_path])
    one, two = rows
    assert one.figures is not None and one.figures["ttft_p50_ms"] == 10.4 and one.runs == 3 == one.runs_ok
    sp = one.spread["ttft_p50_ms"]
    assert (sp.low, sp.high) == (10.0, 11.0) and sp.rmad == pytest.approx(0.4 / 10.4) and not one.noisy
    # 10, 20, 30: the MAD is 10 around a median of 20, 50 %; the ok retry of repeat 3 wins over its invalidated try
    assert two.figures is not None and two.figures["ttft_p50_ms"] == 20.0 and two.status == "ok" and two.runs_ok == 3
    assert two.noisy == {"ttft_p50_ms"} and two.cache == "warm" and one.cache == "flushed"
    assert "accept_length" not in two.noisy and two.spread["accept_length"].rmad == 0
    table = sweepreport.render(rows)
    head = table.splitlines()[0].split("  ")
    assert "CACHE" in head and "RUNS" in head, table
    assert re.search(r"^a=1\s.*flushed\s+3/3\s.*10\.4\* \(10\.0-11\.0, 3\.8%\)", table, re.M), table
    assert re.search(r"^a=2\s.*warm\s+3/3\s.*20\.0 \(10\.0-30\.0, 50\.0%\)!", table, re.M), table
    assert "! noisy: over 10.0%" in table and "warm: ran on a prefix cache" in table
    data = json.loads(sweepreport.render(rows, "json"))["rows"]
    assert data[1]["noisy"] == ["ttft_p50_ms"] and data[1]["spread"]["ttft_p50_ms"] == {"min": 10.0, "max": 30.0,
                                                                                        "rmad": 0.5}
    assert (data[0]["cache"], data[0]["runs"], data[0]["runs_ok"]) == ("flushed", 3, 3)
    # CSV keeps every column where it was: the new ones come last
    head_csv = sweepreport.render(rows, "csv").splitlines()[0]
    assert head_csv.startswith("POINT,STATUS,ATTEMPT,PID,LOAD s,RUN s,ACCEPT,") and head_csv.endswith(",CACHE,RUNS")


def test_resume_counts_repeats(tmp_path: Path) -> None:
    write_results(tmp_path, [({"a": 1}, 1, "ok", 1.0, "cold_start"), ({"a": 1}, 2, "ok", 1.0, "flushed"),
                             ({"a": 2}, 1, "ok", 1.0, "cold_start"), ({"a": 2}, 2, "failed", 1.0, "flushed")])
    p = plan('command = "x"\nrepeats = 2\n[matrix]\na = [1, 2, 3]\n')
    runs = sweepresults.ok_runs(p, tmp_path)
    assert {i: sorted(r["repeat"] for r in recs) for i, recs in runs.items()} == {1: [1, 2], 2: [1]}
    # a plan of 3 repeats has none of its points whole (`--resume` skips a point with every repeat ok)
    three = plan('command = "x"\nrepeats = 3\n[matrix]\na = [1, 2, 3]\n')
    assert [i for i, recs in sweepresults.ok_runs(three, tmp_path).items() if len(recs) == three.repeats] == []


# --- the server's counters ----------------------------------------------------------------------------------

# prometheus_client's exposition (as vLLM and SGLang serve it): every counter with a NAME_created gauge
VLLM_PAGE = """# HELP vllm:prefix_cache_queries_total Prefix cache queries.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} {q0}
vllm:prefix_cache_queries_total{{engine="1",model_name="m"}} {q1}
# HELP vllm:prefix_cache_queries_created Prefix cache queries.
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{{engine="0",model_name="m"}} 1.7963477513729482e+09
vllm:prefix_cache_queries_created{{engine="1",model_name="m"}} 1.7963477513729482e+09
# HELP vllm:prefix_cache_hits_total Prefix cache hits.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{{engine="0",model_name="m"}} {h}
# HELP vllm:spec_decode_num_drafts_total Drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {d}
# HELP vllm:spec_decode_num_accepted_tokens_total Accepted.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {a}
# HELP vllm:num_requests_running Running.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="m"}} 3.0
"""


def test_server_counters_are_summed_over_labels_without_created_and_give_the_runs_figures() -> None:
    before = metricspage.counters(VLLM_PAGE.format(q0=100, q1=50, h=30, d=10, a=15))
    assert before == {"vllm:prefix_cache_queries_total": 150, "vllm:prefix_cache_hits_total": 30,
                      "vllm:spec_decode_num_drafts_total": 10, "vllm:spec_decode_num_accepted_tokens_total": 15}
    after = metricspage.counters(VLLM_PAGE.format(q0=300, q1=50, h=80, d=30, a=45))
    run = servermetrics.over_run(before, after)
    assert run.deltas["vllm:prefix_cache_queries_total"] == 200 and run.prefix_cache_hit_rate == 0.25
    assert run.accept_length == 2.5 and run.accept_source is not None and run.accept_source.startswith("vllm")
    # a restart in between: the counters start again, which is no negative delta but no figure either
    reset = servermetrics.over_run(after, before)
    assert reset.reset and reset.prefix_cache_hit_rate is None and reset.accept_length is None
    assert all(v >= 0 for v in reset.deltas.values())
    # llama.cpp's prompt_tokens exclude the cached ones (the real llama-server 11434: 753 processed, 375 cached)
    llama = servermetrics.over_run({"llamacpp:prompt_tokens_total": 0, "llamacpp:prompt_tokens_cached_total": 0},
                                   {"llamacpp:prompt_tokens_total": 753, "llamacpp:prompt_tokens_cached_total": 375})
    assert llama.prefix_cache_hit_rate == round(375 / 1128, 4) and llama.prefix_cache_source is not None
    with pytest.raises(metricspage.NotMetrics):
        metricspage.counters("vllm:x_total{engine=0} 1\n")


def strict_json(text: str) -> Any:
    """json.loads that refuses NaN and Infinity, as jq, JavaScript and Go do."""
    def refuse(token: str) -> Any:
        raise ValueError(f"not JSON: {token}")
    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize(("before", "after"), [
    ("+Inf", "+Inf"),  # inf - inf = nan, and nan < 0 is false: the old code kept it as a delta
    ("10", "+Inf"),
    ("1e308", "1.7e308"),  # two label sets each, summing past 1.8e308
])
def test_a_counter_that_is_not_finite_is_a_reset_and_no_figure_is_written_as_nan(before: str, after: str) -> None:
    page = ('# TYPE vllm:prefix_cache_hits_total counter\n'
            'vllm:prefix_cache_hits_total{{engine="0"}} {h}\nvllm:prefix_cache_hits_total{{engine="1"}} {h}\n'
            '# TYPE vllm:prefix_cache_queries_total counter\nvllm:prefix_cache_queries_total{{engine="0"}} {q}\n')
    run = servermetrics.over_run(metricspage.counters(page.format(h=before, q=100)),
                                 metricspage.counters(page.format(h=after, q=300)))
    assert run.reset == ["vllm:prefix_cache_hits_total"], run
    assert run.prefix_cache_hit_rate is None and run.deltas == {"vllm:prefix_cache_queries_total": 200}
    assert strict_json(sweepresults.json_text(run.to_json()))["reset"] == ["vllm:prefix_cache_hits_total"]


# --- answers read whole (issue 41 #2) ---------------------------------------------------------------------


class Dribble:
    """A real loopback HTTP server that sends one page in many small writes, each pushed out on its own
    (TCP_NODELAY, a pause between): what a large /metrics page or /slots list looks like on a slow link."""

    def __init__(self, page: bytes, piece: int = 4096) -> None:
        import socket
        self.page, self.piece = page, piece
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.writes = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        import socket
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                head = b""
                while b"\r\n\r\n" not in head and (got := conn.recv(65536)):
                    head += got
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n"
                             b"Content-Length: %d\r\n\r\n" % len(self.page))
                try:
                    for i in range(0, len(self.page), self.piece):
                        conn.sendall(self.page[i:i + self.piece])
                        self.writes += 1
                        time.sleep(0.0005)  # pacing, not synchronisation: each write leaves as its own segment
                except OSError:
                    pass  # the reader stopped at its limit

    def close(self) -> None:
        self.sock.close()


def big_metrics_page(size: int) -> tuple[bytes, float]:
    """A Prometheus page of about `size` bytes: one counter with many label sets (ranks, adapters), and its sum."""
    lines = ["# TYPE vllm:prefix_cache_queries_total counter"]
    n, total, length = 0, 0.0, len(lines[0])
    while length < size:  # counted as it grows: summing every line again each time was a second per megabyte
        lines.append(f'vllm:prefix_cache_queries_total{{engine="{n}",model_name="m",lora="adapter-{n:06d}"}} {n}.0')
        length += len(lines[-1])
        total += n
        n += 1
    return ("\n".join(lines) + "\n").encode(), total


def test_a_page_of_a_megabyte_in_many_small_writes_is_read_whole_and_one_over_the_limit_is_named(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One read() returned what had arrived (32-128 KB of a 265 KB page): the counters failed to parse. A 1 MB page
    sent in 4 KB writes is read to its end; a page over MAX_ANSWER is refused once, naming the limit."""
    page, total = big_metrics_page(1 << 20)
    server = Dribble(page)
    try:
        target = config.parse({"targets": {"t": {"unit": "x.service", "url": server.url}}}, service=False).targets["t"]
        status, body = servercache.ServerHttp(target).get("/metrics")
        assert server.writes > 200, server.writes
        assert status == 200 and len(body) == len(page), (status, len(body), len(page))
        assert metricspage.counters(body.decode()) == {"vllm:prefix_cache_queries_total": total}
        monkeypatch.setattr(servercache, "MAX_ANSWER", 256 << 10)
        status, body = servercache.ServerHttp(target).get("/metrics")
        assert status == 0 and b"over the 262,144-byte limit" in body, (status, body[:200])
    finally:
        server.close()


# --- the flush routes, per server ------------------------------------------------------------------------


class Sim(Simulator):
    """`genready simulate` without a warmup on a free port (with `env`), and what a flush test asks of it."""

    def __init__(self, tmp: Path, *flags: str, env: dict[str, str] | None = None) -> None:
        super().__init__(tmp, "--warmup-seconds", "0", *flags, env=env)

    def target(self, api: str = "openai-completions") -> TargetConfig:
        return config.parse({"targets": {"t": {"unit": "x.service", "url": self.url, "api": api}}},
                            service=False).targets["t"]

    def flushes(self) -> int:
        return self.log.read_text().count(" flushed ")


@pytest.fixture
def sims(tmp_path: Path) -> Iterator[list[Sim]]:
    started: list[Sim] = []
    yield started
    for s in started:
        s.stop()


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        doc: dict[str, Any] = json.loads(r.read())
        return doc


@pytest.mark.system
def test_each_simulated_server_is_flushed_by_its_own_route_or_says_why_not(tmp_path: Path, sims: list[Sim]) -> None:
    def sim(*flags: str, env: dict[str, str] | None = None) -> Sim:
        sims.append(Sim(tmp_path, *flags, env=env))
        return sims[-1]

    sglang = sim("--profile", "sglang", "--token-latency", "0.05")
    # SGLang answers 400 while a generation runs: the flush waits for it to end (40 tokens x 50 ms), then flushes
    busy = threading.Thread(target=post, args=(sglang.url + "/generate",
                                               {"text": "a b", "sampling_params": {"max_new_tokens": 40}}))
    busy.start()
    wait_for(lambda: http(sglang.url + "/flush_cache")[0] == 400, 10, "/flush_cache refused: a generation runs")
    before = sglang.flushes()
    t0 = time.monotonic()
    done = servercache.flush(servercache.ServerHttp(sglang.target("sglang")))
    took = time.monotonic() - t0
    busy.join()
    assert done.ok and done.route == "SGLang /flush_cache" and sglang.flushes() == before + 1, done
    assert took > 0.5, f"flushed after {took:.2f}s: the running generation was not waited for"

    vllm = sim("--profile", "vllm")
    done = servercache.flush(servercache.ServerHttp(vllm.target()))
    assert not done.ok and "VLLM_SERVER_DEV_MODE=1" in done.why and vllm.flushes() == 0, done
    dev = sim("--profile", "vllm", env={"VLLM_SERVER_DEV_MODE": "1"})
    done = servercache.flush(servercache.ServerHttp(dev.target()))
    assert done.route == "vLLM /reset_prefix_cache" and dev.flushes() == 1, done

    llama = sim("--profile", "llamacpp", "--parallel", "2")
    done = servercache.flush(servercache.ServerHttp(llama.target()))
    assert not done.ok and "--slot-save-path" in done.why, done
    llama = sim("--profile", "llamacpp", "--parallel", "2", "--slot-save-path", str(tmp_path))
    done = servercache.flush(servercache.ServerHttp(llama.target()))
    assert done.route.endswith("(2 slots)") and llama.flushes() == 2, done
    nope = sim("--profile", "llamacpp", "--no-slots")
    done = servercache.flush(servercache.ServerHttp(nope.target()))
    assert not done.ok and "--no-slots" in done.why, done


@pytest.mark.system
def test_the_real_llama_server_is_flushed_through_its_slots(tmp_path: Path) -> None:
    """llama-server 11434: every slot's cache erased (the next answer reuses none of it); without
    --slot-save-path the erase is refused (501), and the flush says what to start it with."""
    for what in ("llama-server", "gguf"):
        ci.require(realservers.missing(what), "a test of llama-server's slot erase")
    model = gguf_models.ensure("tiny")["tiny"]
    prompt = " ".join(["The quick brown fox jumps over the lazy dog."] * 6)
    for save in (True, False):
        extra = ["--slot-save-path", str(tmp_path)] if save else []
        with LlamaServer(tmp_path, realservers.llama_server(), "-m", str(model), "-c", "2048", "-np", "2", "-t", "1",
                         "-tb", "1", *extra) as server:
            url = server.url
            target = config.parse({"targets": {"t": {"unit": "x.service", "url": url, "api": "openai-completions"}}},
                                  service=False).targets["t"]
            body = {"prompt": prompt, "max_tokens": 2, "temperature": 0}
            post(url + "/v1/completions", body)
            assert post(url + "/v1/completions", body)["timings"]["cache_n"] > 0  # the prompt was cached
            done = servercache.flush(servercache.ServerHttp(target))
            if save:
                assert done.route.endswith("(2 slots)"), done
                assert post(url + "/v1/completions", body)["timings"]["cache_n"] == 0
            else:
                assert not done.ok and "--slot-save-path" in done.why, done


@pytest.mark.system
def test_the_real_llama_servers_slots_at_np_128_are_read_whole(tmp_path: Path) -> None:
    """llama-server 11434 with -np 128 lists ~159 KB of slots, of which one read() took 128,000 bytes: the flush
    said "listed no slot ids". Every slot is listed, and erased."""
    for what in ("llama-server", "gguf"):
        ci.require(realservers.missing(what), "a test of llama-server's /slots at -np 128")
    model = gguf_models.ensure("tiny")["tiny"]
    with LlamaServer(tmp_path, realservers.llama_server(), "-m", str(model), "-c", "65536", "-np", "128", "-t", "1",
                     "-tb", "1", "--slot-save-path", str(tmp_path), timeout=120) as server:
        url = server.url
        target = config.parse({"targets": {"t": {"unit": "x.service", "url": url, "api": "openai-completions"}}},
                              service=False).targets["t"]
        # A slot that has served a request lists its parameters (~1.2 KB). 128 requests at once do not use
        # every slot on a busy machine (a slot that finished takes the next), so each names its slot with
        # /completion's `id_slot` (tools/server/README.md).
        for i in range(128):
            post(url + "/completion", {"prompt": f"slot {i} " * 5, "n_predict": 8, "id_slot": i})
        status, body = servercache.ServerHttp(target).get("/slots")
        print(f"GET /slots at -np 128: {len(body):,} bytes")
        assert status == 200 and len(json.loads(body)) == 128 and len(body) > 128_000, (status, len(body))
        done = servercache.flush(servercache.ServerHttp(target))
        assert done.route.endswith("(128 slots)"), done


# --- whole sweeps -----------------------------------------------------------------------------------------

BENCH = [PY, "-m", "genready.benchclient", "--api", "openai-completions", "-n", "8", "-c", "1", "--max-tokens", "2",
         "--seed", "1"]


def cache_plan(rig: Rig, between: str, **extra: Any) -> Path:
    doc = {"target": "t", "timeout": 20, "between_points": between, "warmup": 1,
           "command": [*BENCH, "--url", rig.url, "--label", "{c}", "--output", "{out}/bench.jsonl"],
           "dropin": '[Service]\nEnvironment="SIM_FLAGS=--prefill-latency 0.002 {flags}"\n',
           "matrix": {"c": [1, 2, 3], "flags": [""]}, **extra}
    path = rig.tmp / f"plan-{between}.toml"
    path.write_text(tomli_w.dumps(doc))
    return path


def ttfts(rig: Rig) -> list[float]:
    return [json.loads((rig.results / ln["out"] / "bench.jsonl").read_text())["ttft_p50_ms"]
            for ln in rig.results_lines()]


@pytest.fixture
def cache_rig(manager: UserManager, tmp_path: Path) -> Iterator[Rig]:
    r = Rig(manager, tmp_path, {"api": "openai-completions"})
    yield r
    r.close()


@pytest.mark.system
def test_a_reused_points_ttft_is_biased_low_without_a_flush_and_not_with_one(cache_rig: Rig) -> None:
    rig, seen = cache_rig, {}
    for between in ("none", "flush"):
        rig.results = rig.tmp / f"results-{between}"
        rc, out = rig.run(cache_plan(rig, between, **{"matrix": {"c": [1, 2, 3], "flags": [""]}}))
        assert rc == 0, out
        lines = rig.results_lines()
        assert [ln["restarted"] for ln in lines] == [True, False, False]  # one load for the group
        want = "warm" if between == "none" else "flushed"
        assert [ln["cache"] for ln in lines] == ["cold_start", want, want] and all(ln["repeat"] == 1 for ln in lines)
        assert re.search(rf"^c=2 .*\s{want}\s", out, re.M), out
        seen[between] = ttfts(rig)
        # the server's own counters, per run: the flush shows (the generic simulator counts as SGLang does)
        rates = [ln["prefix_cache_hit_rate"] for ln in lines]
        saved = [json.loads((rig.results / ln["out"] / "server_metrics.json").read_text()) for ln in lines]
        assert [m["prefix_cache_hit_rate"] for m in saved] == rates and all(not ln["counters_reset"] for ln in lines)
        assert saved[0]["prefix_cache_source"].startswith("sglang") and saved[0]["counters"][
            "sglang:prompt_tokens_total"] > 0 and not any("_created" in k for k in saved[0]["counters"])
        assert rates[1:] == ([1.0, 1.0] if between == "none" else [0.0, 0.0]), rates
        assert re.search(r"PREFIX HIT", out), out
    # 8 prompts of the built-in set, ~2 ms of prefill per word: with the cache the first point filled, none
    none, flushed = seen["none"], seen["flush"]
    assert max(none[1:]) < 0.5 * min(flushed[1:]), seen
    assert min(flushed[1:]) > 0.5 * flushed[0], seen  # flushed, a reused point is as cold as the first


@pytest.mark.system
def test_a_server_that_cannot_be_flushed_says_so_once_and_its_points_are_warm(cache_rig: Rig) -> None:
    rig = cache_rig
    path = cache_plan(rig, "flush", **{"matrix": {"c": [1, 2, 3], "flags": ["--profile vllm"]}})
    dry = subprocess.run([*sweep_cmd(rig, path), "--dry-run"], capture_output=True, text=True, timeout=60,
                         env=rig.manager.env)
    assert dry.returncode == 0 and "VLLM_SERVER_DEV_MODE=1" in dry.stdout and 'between_points = "restart"' in \
        dry.stdout, dry.stdout + dry.stderr
    rc, out = rig.run(path)
    assert rc == 0, out
    err = rig.err.read_text()
    assert err.count("cannot flush the server's prefix cache") == 1, err
    assert "VLLM_SERVER_DEV_MODE=1" in err and 'between_points = "restart"' in err, err
    assert [ln["cache"] for ln in rig.results_lines()] == ["cold_start", "warm", "warm"]
    assert "warm: ran on a prefix cache" in out


@pytest.mark.system
@pytest.mark.parametrize("stream", [False, True])
def test_sglang_openai_routes_give_an_accept_length_and_say_from_where(tmp_path: Path, sims: list[Sim],
                                                                      stream: bool) -> None:
    """Non-streamed, SGLang's OpenAI answers carry meta_info when asked (return_meta_info); streamed they
    cannot, and before 0.5.12 (no sglext.spec_tokens_details: tests/test_accept.py) the accept length is the
    server's own average, named as such."""
    sims.append(Sim(tmp_path, "--profile", "sglang", "--spec-accept", "2.5", "--sglang-version", "0.5.11"))
    out = tmp_path / "bench.jsonl"
    subprocess.run([PY, "-m", "genready.benchclient", "--url", sims[0].url, "--api", "openai-chat", "-n", "4",
                    "-c", "2", "--max-tokens", "10", "--stream" if stream else "--no-stream", "--output", str(out)],
                   check=True, capture_output=True, timeout=60)
    res = json.loads(out.read_text())
    assert res["ok"] == 4 and res["accept_length"] is not None, res
    if stream:
        assert res["accept_length"] == 2.5 and res["accept_length_source"] == \
            "get_server_info avg_spec_accept_length (SGLang's recent average, not this run's alone)", res
    else:
        # 10 tokens at 2.5 per verify step: 4 steps each, 40 / 16
        assert res["accept_length"] == 2.5 and res["accept_length_source"] == \
            "meta_info.spec_verify_ct (return_meta_info)", res
    assert res["prefix_cache_hit_rate"] is not None and res["prefix_cache_source"].startswith("sglang"), res


def sweep_cmd(rig: Rig, plan_path: Path) -> list[str]:
    from genready_dev.harness import GENREADY
    return [*GENREADY, "sweep", str(plan_path), "--results", str(rig.results), "--config", str(rig.g.config_path)]


@pytest.mark.system
def test_repeats_run_flushed_on_one_instance_and_resume_runs_only_the_missing(cache_rig: Rig) -> None:
    rig = cache_rig
    extra = {"matrix": {"c": [1, 2], "flags": [""]}, "repeats": 2}
    rc, out = rig.run(cache_plan(rig, "flush", **extra))
    assert rc == 0, out
    lines = rig.results_lines()
    assert [(ln["point"]["c"], ln["repeat"], ln["cache"]) for ln in lines] == [
        (1, 1, "cold_start"), (1, 2, "flushed"), (2, 1, "flushed"), (2, 2, "flushed")]
    assert len({ln["pid"] for ln in lines}) == 1 and all("/repeat-" in ln["out"] for ln in lines)
    assert re.search(r"^c=1 .*\s2/2\s.*\(\d+\.\d+-\d+\.\d+, \d+\.\d%\)", out, re.M), out
    # three repeats now: --resume runs only each point's third
    rc, out = rig.run(cache_plan(rig, "flush", **{**extra, "repeats": 3}), "--resume")
    assert rc == 0, out
    new = rig.results_lines()[len(lines):]
    assert [(ln["point"]["c"], ln["repeat"]) for ln in new] == [(1, 3), (2, 3)], new
    assert re.search(r"^c=2 .*\s3/3\s", out, re.M), out


# --- two sweeps compared -----------------------------------------------------------------------------------


def write_side(folder: Path, figures: dict[int, list[dict[str, float]]]) -> None:
    """A results folder: point c=K with one run (a dict of figures) per repeat."""
    lines = []
    for c, runs in figures.items():
        for r, fig in enumerate(runs, 1):
            out = f"{c:02d}-c={c}/repeat-{r}/attempt-1"
            (folder / out).mkdir(parents=True)
            (folder / out / "bench.jsonl").write_text(json.dumps(fig) + "\n")
            lines.append(json.dumps({"point": {"c": c}, "index": c, "status": "ok", "attempt": 1, "out": out,
                                     "repeat": r, "noise_limit": 0.05}))
    folder.mkdir(exist_ok=True)
    (folder / "results.jsonl").write_text("\n".join(lines) + "\n")


def test_compare_shows_each_figures_change_and_marks_the_noise(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    write_side(a, {1: [{"output_tokens_per_second": 100.0, "ttft_p50_ms": 20.0, "itl_p50_ms": 5.0}],
                   2: [{"output_tokens_per_second": v, "ttft_p50_ms": 30.0} for v in (100.0, 120.0, 80.0)],
                   3: [{"output_tokens_per_second": 50.0}]})
    write_side(b, {1: [{"output_tokens_per_second": 130.0, "ttft_p50_ms": 20.4, "itl_p50_ms": 6.0}],
                   2: [{"output_tokens_per_second": v, "ttft_p50_ms": 24.0} for v in (110.0, 112.0, 108.0)],
                   4: [{"output_tokens_per_second": 10.0}]})
    assert report_main([str(a), str(b)], "table", compare=True) == 0
    out = capsys.readouterr().out
    rows = {ln.split()[0]: ln for ln in out.splitlines() if ln.startswith("c=")}
    # one run each: the plan's noise_limit (5 %) is the noise: +30 % is better, a 2 % slower TTFT is inside it,
    # a 20 % higher ITL is worse (lower is better)
    assert "100.0 -> 130.0 +30.0% better" in rows["c=1"] and "20.0 -> 20.4 +2.0% ~" in rows["c=1"], out
    assert "5.00 -> 6.00 +20.0% worse" in rows["c=1"], out
    # repeats: A's tok/s spreads by 20 % (MAD 20 around 100), so +10 % is inside the noise; TTFT -20 % is better
    assert "100.0 -> 110.0 +10.0% ~" in rows["c=2"] and "30.0 -> 24.0 -20.0% better" in rows["c=2"], out
    assert "ok / absent" in rows["c=3"] and "absent / ok" in rows["c=4"], out
    assert report_main([str(a), str(b)], "html", compare=True) == 0
    page = capsys.readouterr().out
    assert '<td class="better">100.0 -&gt; 130.0 +30.0% better</td>' in page and 'class="noise"' in page
    for bad in (([str(a)], "table"), ([str(a), str(b)], "csv")):
        with pytest.raises(Failed) as e:
            report_main(bad[0], bad[1], compare=True)
        assert e.value.status == 64 and "--compare" in str(e.value)
