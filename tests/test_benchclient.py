"""The benchmark client against real simulator processes: every API, the pid line, failures, timeouts."""

from __future__ import annotations

import json
import os
import pty
import random
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from genready import apis
from genready.tools import benchclient
from genready_dev.harness import PY, env_without_notify, free_port, wait_for

BENCH = [PY, "-m", "genready.benchclient"]
GUARD_ENV = {"GENREADY_PID": "4242", "GENREADY_INVOCATION_ID": "0123456789abcdef0123456789abcdef",
             "GENREADY_UNIT": "sglang.service"}


class Sim:
    """`genready simulate` on a free port, its lifecycle lines in a file."""

    def __init__(self, tmp: Path, *flags: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / f"sim-{self.port}.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen([PY, "-m", "genready.cli", "simulate", "--port", str(self.port), *flags],
                                         stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        wait_for(lambda: " ready" in self.log.read_text() or self.proc.poll() is not None, 20, "the simulator")
        assert self.proc.poll() is None, self.log.read_text()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    s = Sim(tmp_path_factory.mktemp("sim"), "--token-latency", "0.001")
    yield s
    s.stop()


def bench(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    full_env = env_without_notify()
    for k in GUARD_ENV:
        full_env.pop(k, None)
    full_env.update(env or {})
    return subprocess.run([*BENCH, *args], env=full_env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("api", apis.NAMES)
def test_every_api_counts_and_names_the_guarded_pid(sim: Sim, api: str, tmp_path: Path) -> None:
    out = tmp_path / "results.jsonl"
    r = bench("--url", sim.url, "--api", api, "-n", "12", "-c", "3", "--max-tokens", "5", "--target", "sglang",
              "--output", str(out), env=GUARD_ENV)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == (f"benchclient: 12 requests at concurrency 3 to {sim.url} ({api}, max_tokens 5, "
                        "streaming), target sglang, pid 4242")
    assert "  requests   12 ok, 0 failed" in lines
    assert any(line.startswith("  rate       ") and " requests/s, " in line and " tokens/s over " in line
               for line in lines)
    assert any(line.startswith("  latency    p50 ") and ", p99 " in line for line in lines)
    assert lines[-1] == ("  served by pid 4242 (invocation 0123456789abcdef0123456789abcdef, unit sglang.service)")
    assert any(line.startswith("  ttft       p50 ") for line in lines)
    assert any(line.startswith("  itl        p50 ") for line in lines)
    # Not a terminal: plain progress lines, no bar.
    assert "\r" not in r.stderr and "benchclient: 12/12 done" in r.stderr.splitlines()
    result = json.loads(out.read_text())
    assert (result["ok"], result["failed"], result["api"], result["target"]) == (12, 0, api, "sglang")
    assert result["served_by"] == {"pid": "4242", "invocation_id": GUARD_ENV["GENREADY_INVOCATION_ID"],
                                   "unit": "sglang.service"}
    # 5 tokens per request, counted from the server's own usage figures.
    assert result["tokens_per_second"] == pytest.approx(5 * result["requests_per_second"], rel=1e-3)
    assert 0 < result["latency_p50_ms"] <= result["latency_p99_ms"]
    assert 0 < result["ttft_p50_ms"] <= result["ttft_p99_ms"] <= result["e2e_p99_ms"]
    assert result["output_tokens"] == 60 and result["stream"] is True


@pytest.mark.parametrize("api", apis.NAMES)
def test_streaming_times_the_first_token_and_the_gaps_between_tokens(tmp_path: Path, api: str) -> None:
    """The simulator paces each token by --token-latency: the gaps the client sees are token gaps,
    not whole requests, and the first token comes one gap after the request, not at its end."""
    s = Sim(tmp_path, "--token-latency", "0.03")
    try:
        out = tmp_path / "r.jsonl"
        r = bench("--url", s.url, "--api", api, "-n", "4", "-c", "2", "--max-tokens", "6", "--label", "pace",
                  "--output", str(out), env={"GENREADY_SWEEP_POINT": '{"budget": 8}', **GUARD_ENV})
    finally:
        s.stop()
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(out.read_text())
    assert 25 <= res["itl_p50_ms"] <= 150, res  # one token's latency, with room for a busy machine
    assert 25 <= res["ttft_p50_ms"] < res["e2e_p50_ms"], res
    assert res["e2e_p50_ms"] >= 6 * 30 * 0.9, res
    assert res["output_tokens"] == 24 and res["label"] == "pace"
    assert res["sweep_point"] == {"budget": 8} and res["served_by"]["pid"] == "4242"
    assert '  sweep point {"budget": 8}' in r.stdout and ", label pace," in r.stdout.splitlines()[0]


def test_poisson_arrivals_follow_the_seeded_schedule(sim: Sim, tmp_path: Path) -> None:
    """--request-rate spaces the sends by exponential gaps; with --seed the schedule is known."""
    rng = random.Random(7)
    gaps = sum(rng.expovariate(10.0) for _ in range(7))  # 8 requests: 7 gaps between sends
    out = tmp_path / "p.jsonl"
    r = bench("--url", sim.url, "-n", "8", "-c", "8", "--request-rate", "10", "--seed", "7", "--output", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(out.read_text())
    assert res["wall_seconds"] >= gaps and res["request_rate"] == 10.0 and res["ok"] == 8
    assert "Poisson 10 requests/s" in r.stdout.splitlines()[0]


def test_no_stream_has_no_token_timings(sim: Sim, tmp_path: Path) -> None:
    out = tmp_path / "n.jsonl"
    r = bench("--url", sim.url, "-n", "3", "--no-stream", "--output", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(out.read_text())
    assert res["stream"] is False and res["ttft_p50_ms"] is None and res["itl_p50_ms"] is None
    assert "ttft" not in r.stdout and "streaming" not in r.stdout


def test_no_pid_line_outside_guard(sim: Sim) -> None:
    r = bench("--url", sim.url, "-n", "3")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "served by" not in r.stdout
    assert ", pid " not in r.stdout.splitlines()[0]


def test_openai_model_is_discovered(sim: Sim, tmp_path: Path) -> None:
    """Without --model the client asks /v1/models, as a user would; the simulator's name comes back."""
    r = bench("--url", sim.url, "--api", "openai-chat", "-n", "2", "--output", str(tmp_path / "o.jsonl"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "cannot read a model" not in r.stderr


def test_failing_server_exits_nonzero(tmp_path: Path) -> None:
    s = Sim(tmp_path, "--fail-rate", "1")
    try:
        r = bench("--url", s.url, "-n", "6", "-c", "2", env=GUARD_ENV)
    finally:
        s.stop()
    assert r.returncode == 1, r.stdout + r.stderr
    assert "  requests   0 ok, 6 failed (6x HTTP 500)" in r.stdout.splitlines()
    assert "latency    p50 -, p99 -" in r.stdout
    assert "served by pid 4242" in r.stdout  # which server failed matters as much as which one worked


def test_unreachable_server_exits_nonzero() -> None:
    r = bench("--url", f"http://127.0.0.1:{free_port()}", "-n", "3")
    assert r.returncode == 1
    assert "0 ok, 3 failed (3x cannot connect: Connection refused)" in r.stdout


def test_hung_server_is_time_bounded(tmp_path: Path) -> None:
    """A server that accepts but never answers costs --timeout per request, not forever."""
    s = Sim(tmp_path, "--hang-after", "0")
    try:
        r = bench("--url", s.url, "-n", "4", "-c", "4", "--timeout", "0.5", timeout=20)
    finally:
        s.stop()
    assert r.returncode == 1
    assert "0 ok, 4 failed (4x timeout (0.5 s))" in r.stdout


def test_progress_bar_only_on_a_terminal(sim: Sim) -> None:
    master, slave = pty.openpty()
    try:
        proc = subprocess.run([*BENCH, "--url", sim.url, "-n", "5", "-c", "1"], env=env_without_notify(),
                              stdout=subprocess.PIPE, stderr=slave, text=True, timeout=60)
        os.close(slave)
        slave = -1
        seen = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the terminal's other side is closed and drained
                break
            if not chunk:
                break
            seen += chunk
    finally:
        if slave >= 0:
            os.close(slave)
        os.close(master)
    assert proc.returncode == 0
    assert b"5/5" in seen and b"[####" in seen
    assert "5/5" not in proc.stdout  # the bar never mixes into the result on stdout


@pytest.mark.parametrize("args", [["-n", "0"], ["-c", "-1"], ["--timeout", "nan"], ["--api", "grpc"]])
def test_usage_errors(args: list[str]) -> None:
    r = bench(*args)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert benchclient.percentile(values, 50) == 50.0
    assert benchclient.percentile(values, 99) == 99.0
    assert benchclient.percentile([7.0], 99) == 7.0
    assert benchclient.percentile([], 50) is None


def test_api_key_from_a_genready_config_target(tmp_path: Path) -> None:
    """--config takes the target's url, api and API key, as the probe uses them; without the key: 401s."""
    s = Sim(tmp_path, "--api-key", "s3cret")
    try:
        keyfile = tmp_path / "key"
        keyfile.write_text("s3cret\n")
        cfg = tmp_path / "genready.toml"
        cfg.write_text(f'[targets.llm]\nunit = "llm.service"\nurl = "{s.url}"\napi = "openai-chat"\n'
                       f'api_key_file = "{keyfile}"\n')
        r = bench("--config", str(cfg), "-n", "3", "--max-tokens", "2")
        assert r.returncode == 0, r.stdout + r.stderr
        assert r.stdout.splitlines()[0].startswith(f"benchclient: 3 requests at concurrency 4 to {s.url} (openai-chat")
        assert "target llm" in r.stdout.splitlines()[0]
        r = bench("--url", s.url, "-n", "2", "--max-tokens", "2")
        assert r.returncode == 1 and "2x HTTP 401" in r.stdout, r.stdout
        r = bench("--url", s.url, "-n", "2", "--max-tokens", "2", "--api-key-file", str(keyfile))
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        s.stop()
