"""A target knows its kind (issue 49 §1), and a flag's value is what the server got (issue 53 item 1).

In-process: systemd's expansion of ExecStart= words, `serverkind.resolve` on real processes (one whose
command line names a kind, a wrapper whose child does, one gone), the `kind` key, and the sweep's decision
(`confirm.judge`) when the engine cannot be asked. tests/test_sweep_confirm.py runs the sweep on a wrapper
unit and on `${MODEL}` against the simulator under a real systemd manager.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from genready import config
from genready.probe import serverkind
from genready.probe.owner import cmdline, descendants
from genready.servers import engineconfig as ec
from genready.servers import kinds
from genready.sweep.run import confirm
from genready.systemd import unitexec
from genready.systemd.unitexec import expand
from genready.vocab import KindSource
from genready_dev.harness import PY, Genready, free_port, wait_for
from genready_dev.usermanager import UserManager
from tests.test_sweep import FAST

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]
SGLANG_ARGS = ["-m", "sglang.launch_server", "--model-path", "/models/a", "--speculative-num-steps", "3"]


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        p.kill()
        p.wait()


def spawn(procs: list[subprocess.Popen[bytes]], argv: list[str]) -> int:
    p = subprocess.Popen(argv)
    procs.append(p)
    # Popen returns once exec began: the kernel sets the new command line a moment later
    wait_for(lambda: cmdline(p.pid) == argv, 10, f"{argv[:3]} exec'd")
    return p.pid


# --- systemd's expansion ---------------------------------------------------------------------------------


def test_expand_as_systemd_does() -> None:
    env = {"MODEL": "/models/a b", "OPTIONS": "--port 30333  --tp 2", "EMPTY": ""}
    words, unknown = expand(["/bin/x", "--model-path", "${MODEL}", "$OPTIONS", "--n=${MODEL}x", "$EMPTY", "$$HOME"],
                            env)
    # ${VAR}: its value as one word, inside a word too; $VAR alone: split at whitespace, none for an empty one
    assert words == ["/bin/x", "--model-path", "/models/a b", "--port", "30333", "--tp", "2", "--n=/models/a bx",
                     "$HOME"]
    assert unknown == ()


def test_expand_leaves_what_it_does_not_know_as_written() -> None:
    words, unknown = expand(["/bin/x", "--port", "${PORT}", "$MAINPID", "${CREDENTIALS_DIRECTORY}/k", "$PORT"], {})
    assert words == ["/bin/x", "--port", "${PORT}", "$MAINPID", "${CREDENTIALS_DIRECTORY}/k", "$PORT"]
    assert unknown == ("PORT", "MAINPID", "CREDENTIALS_DIRECTORY")


# --- resolve ---------------------------------------------------------------------------------------------


def expanded(words: list[str], env: dict[str, str]) -> dict[str, Any]:
    """resolve's exec_start and unknown for a unit's ExecStart= line and environment, as its callers pass them."""
    argv, unknown = unitexec.expand(words, env)
    return {"exec_start": argv, "unknown": unknown}


@pytest.mark.system
def test_the_process_that_serves_names_the_kind(procs: list[subprocess.Popen[bytes]]) -> None:
    pid = spawn(procs, [*SLEEP, *SGLANG_ARGS])
    # ExecStart= is a wrapper script: its words name nothing, the process it exec'd does
    found = serverkind.resolve("auto", pids=[pid], exec_start=["/opt/run-sglang.sh"], unknown=())
    assert found.kind is kinds.SGLANG and found.source is KindSource.PROCESS and found.pid == pid
    assert found.argv_from == "process" and found.args == tuple(SGLANG_ARGS[2:])
    assert found.to_json() == {"name": "sglang", "from": "process", "pid": pid}
    # the key wins over the guess, and keeps the process's arguments when they are of its kind
    named = serverkind.resolve("sglang", pids=[pid])
    assert named.source is KindSource.CONFIG and named.args == tuple(SGLANG_ARGS[2:])
    other = serverkind.resolve("vllm", pids=[pid])
    assert other.kind is kinds.VLLM and other.args is None and other.argv_from == "process"


@pytest.mark.system
def test_a_wrapper_that_does_not_exec_is_looked_through_to_its_child(procs: list[subprocess.Popen[bytes]]) -> None:
    script = " ".join(f"'{a}'" for a in [*SLEEP, *SGLANG_ARGS]) + " & wait"
    sh = spawn(procs, ["/bin/sh", "-c", script])
    child = wait_for(lambda: descendants(sh), 10, "the wrapper's child")[0]
    wait_for(lambda: "sglang.launch_server" in (cmdline(child) or []), 10, "the child's exec")
    found = serverkind.resolve(pids=[sh])
    assert (found.kind, found.source, found.pid) == (kinds.SGLANG, KindSource.PROCESS, child)


@pytest.mark.system
def test_without_a_process_the_units_words_expanded(procs: list[subprocess.Popen[bytes]]) -> None:
    gone = spawn(procs, SLEEP)
    procs[-1].kill()
    procs[-1].wait()
    words = ["/usr/bin/python3", "-m", "sglang.launch_server", "--model-path", "${MODEL}"]
    found = serverkind.resolve(pids=[gone], **expanded(words, {"MODEL": "/models/a"}))
    assert found.kind is kinds.SGLANG and found.source is KindSource.EXEC_START
    assert found.args == ("--model-path", "/models/a") and found.argv_from == "ExecStart"
    assert f"/proc/{gone}/cmdline cannot be read" in found.notes[0]
    # a variable genready does not know: the kind still, but not what the server got
    found = serverkind.resolve(pids=[gone], **expanded(words, {}))
    assert found.kind is kinds.SGLANG and found.args is None and found.argv == ()
    assert "the unit's ExecStart= uses $MODEL, which genready does not know" in found.notes
    unknown = serverkind.resolve(exec_start=["/opt/run.sh"])
    assert unknown.kind is None and unknown.source is KindSource.UNKNOWN
    assert unknown.to_json() == {"name": None, "from": "unknown", "pid": None}


# --- the key ------------------------------------------------------------------------------------------------


def test_the_kind_key() -> None:
    base = {"unit": "a.service", "url": "http://127.0.0.1:1"}
    assert config.parse({"targets": {"t": base}}).targets["t"].kind == "auto"
    for k in kinds.KINDS:
        assert config.parse({"targets": {"t": {**base, "kind": k.name}}}).targets["t"].kind == k.name
        assert serverkind.configured(k.name) is k
    with pytest.raises(config.ConfigError) as e:
        config.parse({"targets": {"t": {**base, "kind": "tgi"}}}, "g.toml")
    assert e.value.key == "targets.t.kind" and e.value.file == "g.toml"
    assert "'auto', 'sglang', 'vllm'" in e.value.expected and e.value.found == "string 'tgi'"


# --- the sweep's decision when the engine cannot be asked --------------------------------------------------


def engine(unasked: str = "", values: dict[str, ec.Scalar] | None = None,
           want: dict[str, tuple[str, str]] | None = None,
           sources: tuple[str, ...] = ("GET /server_info",)) -> confirm.Engine:
    if unasked:
        return confirm.Engine(None, None, {}, ec.EngineConfig(problems=[unasked]), unasked)
    got = ec.EngineConfig(dict(values or {}), list(sources), [] if sources else ["GET /server_info 503"])
    return confirm.Engine(kinds.SGLANG, kinds.SGLANG.engine, want or {}, got)


def test_an_expect_that_cannot_be_checked_never_passes() -> None:
    # issue 49 §1: a wrapper unit whose kind nobody knows used to pass every point's expect silently
    why = "sim.service runs no server kind genready knows (/opt/run-sglang.sh)"
    checked = confirm.judge(engine(unasked=why), {"speculative_num_steps": "3"})
    assert checked is not None and checked.verdict.status == ec.CONFIG_MISMATCH
    assert checked.verdict.reason == f"expect cannot be checked: {why}"
    assert checked.records()["config_check"]["unconfirmed"] == [
        {"flag": "expect.speculative_num_steps", "key": "speculative_num_steps", "expected": "3"}]
    assert confirm.judge(engine(unasked=why), {}) is None  # no expect: nothing to check, the point runs
    # asked, but none of its sources answered: the same
    silent = confirm.judge(engine(sources=()), {"speculative_num_steps": "3"})
    assert silent is not None and silent.verdict.status == ec.CONFIG_MISMATCH
    assert "SGLang answered none of its sources (GET /server_info 503)" in silent.verdict.reason


def test_the_flags_the_server_got_are_compared() -> None:
    # issue 53 item 1: --model-path ${MODEL} as systemd expands it (from the unit's words here, where no process
    # can be read; test_the_process_that_serves_names_the_kind reads the process's), not as the words spell it
    words = ["/usr/bin/python3", "-m", "sglang.launch_server", "--model-path", "${MODEL}", "$STEPS"]
    found = serverkind.resolve(**expanded(words, {"MODEL": "/models/a", "STEPS": "--speculative-num-steps 3"}))
    assert found.args == ("--model-path", "/models/a", "--speculative-num-steps", "3")
    read = kinds.SGLANG.engine
    assert read is not None
    e = engine(values={"model_path": "/models/a", "speculative_num_steps": 3}, want=ec.expected(read, found.args))
    checked = confirm.judge(e, {"speculative_num_steps": "3"})
    assert checked is not None and checked.verdict.status is None, checked
    assert set(checked.conf.confirmed) == {"model_path", "speculative_num_steps"}
    wrong = confirm.judge(e, {"speculative_num_steps": "4"})
    assert wrong is not None and wrong.verdict.status == ec.CONFIG_MISMATCH


# --- the daemon's /status --------------------------------------------------------------------------------------


@pytest.mark.system
def test_status_names_the_kind_the_process_behind_a_wrapper_runs(manager: UserManager, tmp_path: Path) -> None:
    port = free_port()
    script = tmp_path / "run-sglang.sh"
    script.write_text(f'#!/bin/sh\nexec {PY} -m genready.cli simulate --profile sglang "$@"\n')
    script.chmod(0o755)
    unit = "kind-wrap.service"
    manager.install_unit(unit, f"[Service]\nExecStart={script} --port {port} --load-seconds 0.2\n")
    manager.systemctl("start", unit)
    g = Genready(manager, tmp_path, {"w": {"unit": unit, "url": f"http://127.0.0.1:{port}", **FAST},
                                     "c": {"unit": unit, "url": f"http://127.0.0.1:{port}", "kind": "vllm", **FAST}})
    try:
        g.start()
        wait_for(lambda: g.get("/ready/w")[0] == 200, 20, "the wrapper's start verified")
        _, status = g.get("/status")
        w = status["targets"]["w"]
        # ExecStart= names a script; the process it exec'd (the one that answered the probe) names SGLang
        assert w["kind"] == {"name": "sglang", "from": "process", "pid": w["pid"]}, w
        assert w["api"] == "sglang"  # unchanged beside it
        c = status["targets"]["c"]
        assert c["kind"]["name"] == "vllm" and c["kind"]["from"] == "config", c  # the key wins over the guess
        # a reload that changes only the kind keeps the verified start (the probe does not depend on it)
        verified = g.get("/ready/w")[1]
        text = g.config_path.read_text()
        g.config_path.write_text(text.replace('[targets.w]\n', '[targets.w]\nkind = "llama.cpp"\n'))
        assert g.proc is not None
        g.proc.send_signal(signal.SIGHUP)
        kind = wait_for(lambda: (k := g.get("/status")[1]["targets"]["w"]["kind"])["from"] == "config" and k, 10,
                        "the reloaded kind")
        assert kind["name"] == "llama.cpp"
        assert g.get("/ready/w") == (200, verified)  # the same verification, not revoked and made again
    finally:
        g.stop()
        manager.systemctl("stop", unit, check=False)
        manager.remove_unit(unit)


def test_a_read_no_source_answered_is_read_again_at_the_next_point(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 53 #9: a failed read of the engine's report was kept for the loaded instance, and every later point
    of it was config_mismatch; a read that got nothing is asked again at the next point, a good one is kept."""
    reads = [engine(sources=()), engine(values={"speculative_num_steps": 3}), engine(values={"x": 1})]
    asked: list[int] = []

    def read(ctx: object, point: object, v: object) -> confirm.Engine:
        asked.append(1)
        return reads[len(asked) - 1]

    monkeypatch.setattr(confirm, "read_engine", read)
    ctx = cast(Any, SimpleNamespace(opts=SimpleNamespace(plan=SimpleNamespace(expect_for=lambda p: {})),
                                    console=SimpleNamespace(progress=lambda *a: None)))
    v = cast(Any, SimpleNamespace(invocation_id="i1"))
    engines: dict[str, confirm.Engine | None] = {}
    confirm.confirm(ctx, cast(Any, None), v, engines)
    checked = confirm.confirm(ctx, cast(Any, None), v, engines)  # the first read got nothing: read again
    assert len(asked) == 2 and checked is not None and checked.engine.got.values == {"speculative_num_steps": 3}
    confirm.confirm(ctx, cast(Any, None), v, engines)  # a good read is kept for the instance
    assert len(asked) == 2
