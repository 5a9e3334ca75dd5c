"""The GPU watch's surfaces, in process (issue 40): the sweep's wait for strays against a real HTTP
server on loopback answering /status as the daemon does, `genready status`'s and the live line's
words, and the report's tokens per joule and throttle mark."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from genready.client import client, progress, waiting
from genready.sweep.plan import parse_plan
from genready.sweep.report import collect
from genready.sweep.report import table as report
from genready.sweep.rows import mark_best
from genready.sweep.run import strays
from genready.sweep.run.steps import Signals, SweepOptions

GPU0 = "GPU-8a4c5e1f-0b7e-2d3c-9f61-5b2e7d3a9c10"
STRAY: dict[str, Any] = {"gpu": GPU0, "pid": 4242, "bytes": 70000 << 20, "role": "stray", "invocation_id": "a" * 32,
                         "unit": "llm.service", "command": "python3 -m sglang.scheduler", "why": "in the cgroup",
                         "line": f"{GPU0} holds 68.4 GiB in PID 4242 (python3 -m sglang.scheduler); "
                                 "end it with `kill 4242`"}


class Daemon(http.server.ThreadingHTTPServer):
    """Answers /status with `strays` for target t (a list the test changes), counting the asks."""

    def __init__(self) -> None:
        self.strays: list[dict[str, Any]] = []
        self.asks = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.asks += 1
                body = json.dumps({"targets": {"t": {"gpu": {"strays": outer.strays}}}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)


@pytest.fixture
def daemon() -> Iterator[Daemon]:
    d = Daemon()
    threading.Thread(target=d.serve_forever, args=(0.02,), daemon=True).start()  # shutdown() waits a poll
    yield d
    d.shutdown()
    d.server_close()


def options(d: Daemon, wait: float, *, ignore: bool = False) -> SweepOptions:
    plan = parse_plan({"command": "x", "stray_wait": wait, "points": [{"n": 1}]})
    return SweepOptions(plan, f"http://127.0.0.1:{d.server_address[1]}", "t", "llm.service", "user", 10.0,
                        Path("/nonexistent"), ignore_strays=ignore)


def test_the_sweep_goes_on_at_once_without_strays(daemon: Daemon) -> None:
    said: list[str] = []
    assert strays.wait_out(options(daemon, 60), said.append, Signals()) == "" and said == [] and daemon.asks == 1


def test_the_sweep_waits_for_a_stray_to_exit_then_goes_on(daemon: Daemon) -> None:
    daemon.strays = [STRAY]
    said: list[str] = []

    def sleep(s: float) -> None:  # the stray exits during the second wait (no real time passes)
        if daemon.asks >= 2:
            daemon.strays = []

    assert strays.wait_out(options(daemon, 60), said.append, Signals(), sleep) == ""
    assert daemon.asks == 3 and "waiting up to 60 s" in said[0] and "PID 4242" in said[0]


def test_the_sweep_stops_after_stray_wait_naming_the_stray_and_how_to_end_it(daemon: Daemon) -> None:
    daemon.strays = [STRAY]
    why = strays.wait_out(options(daemon, 0.05), lambda _: None, Signals(), lambda s: None)
    assert "PID 4242" in why and "kill 4242" in why and "systemctl --user kill --kill-whom=all llm.service" in why
    assert "after 0.05 s (stray_wait)" in why and "--ignore-strays" in why


def test_ignore_strays_does_not_ask(daemon: Daemon) -> None:
    daemon.strays = [STRAY]
    assert strays.wait_out(options(daemon, 60, ignore=True), lambda _: None, Signals()) == "" and daemon.asks == 0


def test_a_stray_holding_no_memory_is_not_waited_for(daemon: Daemon) -> None:
    daemon.strays = [{**STRAY, "bytes": 0}]
    assert strays.wait_out(options(daemon, 60), lambda _: None, Signals()) == ""


def test_genready_status_shows_the_current_starts_memory_and_each_stray() -> None:
    t = {"unit": "llm.service", "state": "ready", "gpu": {"read_at": "x", "error": None,
                                                          "current_bytes": {GPU0: 1 << 30}, "strays": [STRAY]}}
    text = client.format_status({"targets": {"llm": t}})
    assert f"llm: GPU memory of the current start: {GPU0} 1.0 GiB" in text
    assert "STRAY PID" in text and "68.4 GiB" in text and "aaaaaaaaaaaa" in text and "kill 4242" in text
    assert "kill 4242" in client.format_status_tty({"targets": {"llm": t}})
    assert "GPU" not in client.format_status({"targets": {"llm": {**t, "gpu": None}}})


def test_the_live_line_and_the_failure_lines_name_the_strays_of_a_failed_start() -> None:
    failed = {"invocation_id": "b" * 32, "result": "exit-code", "exit_code": "exited", "exit_status": 1,
              "journal": ["CUDA out of memory"], "restarting": False, "gpu_strays": [STRAY]}
    line = progress.target_line({"target": "llm", "state": "inactive", "start_failed": failed})
    assert "stray PID 4242 (python3 -m sglang.scheduler) on " + GPU0 in line
    assert waiting.failure_lines(failed)[-1] == f"  GPU memory was held by a stray: {STRAY['line']}"
    assert "stray" not in progress.target_line({"target": "llm", "state": "inactive",
                                                "start_failed": {**failed, "gpu_strays": None}})


def test_the_report_shows_tokens_per_joule_and_marks_a_throttled_run(tmp_path: Path) -> None:
    lines = [{"index": i, "point": {"c": i}, "status": "ok", "attempt": 1, "out": f"0{i}-c={i}/attempt-1",
              "tokens_per_joule": tpj, "throttled": thr} for i, tpj, thr in ((1, 2.5, False), (2, 1.25, True))]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    for ln in lines:
        (tmp_path / str(ln["out"])).mkdir(parents=True)
        (tmp_path / str(ln["out"]) / "bench.jsonl").write_text(json.dumps({"output_tokens_per_second": 10.0}) + "\n")
    rows = collect.rows_of([tmp_path])
    mark_best(rows)
    text = report.render(rows)
    assert "TOK/J" in text and "2.500*" in text and "1.250~" in text and "~ throttled" in text, text
    assert [r["throttled"] for r in json.loads(report.render(rows, "json"))["rows"]] == [False, True]
