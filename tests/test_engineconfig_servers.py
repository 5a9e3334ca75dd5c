"""The engine confirms what it runs, end to end (issue 38 §2): a unit of the private systemd user manager
runs the simulator under each profile; its ExecStart= is read over D-Bus as the sweep reads it, the
server's own report is read over loopback HTTP (and, for vLLM, from the start's output file), and the two
are compared. A drop-in whose later ExecStart= sets another value, and an engine that reports something
other than its flags (--engine-report), each make a named mismatch. Then the real llama-server's /props
and /slots, where it is built."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from genready import config
from genready.servers import engineconfig as ec
from genready.servers import kinds
from genready.systemd import unitexec, unitlog
from genready.systemd.unitlog import OutputMark
from genready.tools import servercache
from genready_dev import realservers
from genready_dev.harness import GENREADY, free_port, http, wait_for
from genready_dev.usermanager import UserManager
from tests import ci

KEY = "sk-engine-7c1d"


def complete(port: int, key: str = "") -> None:
    """One generation: a llama.cpp slot lists its task's params from then on (the sweep's verification ran one)."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", method="POST",
                                 data=json.dumps({"prompt": "The quick", "max_tokens": 4}).encode(),
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": f"Bearer {key}"} if key else {})})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200


class SimUnit:
    """One simulator as a unit, its output in a file; `confirm()` is what the sweep does after verification."""

    def __init__(self, manager: UserManager, tmp: Path, name: str, profile: str, *flags: str) -> None:
        self.manager, self.unit, self.port = manager, f"{name}.service", free_port()
        self.out = tmp / f"{name}.log"
        cmd = " ".join([*GENREADY, "simulate", "--profile", profile, "--port", str(self.port),
                        "--warmup-seconds", "0", "--api-key", KEY, *flags])
        self.fragment = manager.install_unit(self.unit, f"[Service]\nExecStart={cmd}\n"
                                                        f"StandardOutput=append:{self.out}\n"
                                                        f"StandardError=append:{self.out}\n")
        self.dropins: list[str] = []

    def dropin(self, text: str) -> None:
        d = self.fragment.parent / f"{self.unit}.d"
        d.mkdir(exist_ok=True)
        (d / "sweep.conf").write_text(text)
        self.dropins.append(str(d / "sweep.conf"))
        self.manager.systemctl("daemon-reload")

    def start(self) -> OutputMark:
        mark = OutputMark.take(str(self.fragment), self.dropins)
        self.manager.systemctl("restart", self.unit)
        wait_for(lambda: http(f"http://127.0.0.1:{self.port}/health")[0] == 200, 30, f"{self.unit} healthy")
        return mark

    def confirm(self, mark: OutputMark) -> tuple[ec.EngineConfig, ec.Confirmation]:
        argv = unitexec.read("user", self.unit).commands[-1]  # the ExecStart= systemd runs
        found = kinds.serving(argv)
        assert found is not None and found[0].engine is not None, argv
        kind, args = found
        read = kind.engine
        assert read is not None
        line = mark.first_line("user", self.unit, read.args_mark, secrets=[KEY]) if read.args_mark else None
        target = config.parse({"targets": {"t": {"unit": self.unit, "url": f"http://127.0.0.1:{self.port}",
                                                 "api_key_file": str(self.key_file())}}}, service=False)
        got = servercache.engine_config(servercache.ServerHttp(target.targets["t"]), read, line)
        return got, ec.compare(read, ec.expected(read, args), got.values)

    def key_file(self) -> Path:
        p = self.out.with_suffix(".key")
        p.write_text(KEY + "\n")
        p.chmod(0o600)
        return p

    def stop(self) -> None:
        self.manager.systemctl("stop", self.unit, check=False)
        self.manager.remove_unit(self.unit)


@pytest.fixture
def units(manager: UserManager, tmp_path: Path) -> Iterator[list[SimUnit]]:
    made: list[SimUnit] = []
    yield made
    for u in made:
        u.stop()


def test_sglang_reports_its_server_args_and_a_later_execstart_is_what_runs(
        manager: UserManager, tmp_path: Path, units: list[SimUnit]) -> None:
    u = SimUnit(manager, tmp_path, "ec-sglang", "sglang", "--speculative-algorithm", "NEXTN",
                "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--context-length", "4096")
    units.append(u)
    got, conf = u.confirm(u.start())
    assert got.sources == ["GET /server_info"] and got.problems == []
    assert conf.mismatches == () and set(conf.confirmed) >= {"speculative_algorithm", "speculative_num_steps",
                                                              "speculative_eagle_topk", "context_length"}
    assert got.to_json()["values"]["api_key"] == "***" and KEY not in str(got.to_json())
    # A drop-in's ExecStart= replaces the command: systemd runs the new one, and so does the comparison.
    cmd = " ".join([*GENREADY, "simulate", "--profile", "sglang", "--port", str(u.port), "--warmup-seconds", "0",
                    "--api-key", KEY, "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "5",
                    "--engine-report", "speculative_num_steps=2"])
    u.dropin(f"[Service]\nExecStart=\nExecStart={cmd}\n")
    got, conf = u.confirm(u.start())
    assert [(m.flag, m.expected, m.reported) for m in conf.mismatches] == [("--speculative-num-steps", "5", 2)]
    v = ec.verdict(conf)
    assert v.status == ec.CONFIG_MISMATCH and "--speculative-num-steps 5" in v.reason


def test_vllm_is_read_from_its_start_line_and_its_info_gauges(
        manager: UserManager, tmp_path: Path, units: list[SimUnit]) -> None:
    u = SimUnit(manager, tmp_path, "ec-vllm", "vllm", "--speculative-config",
                "'{\"method\": \"eagle\", \"num_speculative_tokens\": 3}'", "--tensor-parallel-size", "2",
                "--max-model-len", "2048")
    units.append(u)
    got, conf = u.confirm(u.start())
    assert "log line 'non-default args:'" in got.sources and "GET /metrics *_info" in got.sources, got
    assert got.values["vllm:cache_config_info.block_size"] == "16"
    assert conf.mismatches == () and conf.unconfirmed == ()
    assert set(conf.confirmed) == {"speculative_config.method", "speculative_config.num_speculative_tokens",
                                   "tensor_parallel_size", "max_model_len"}
    u.dropin("[Service]\nEnvironment=UNUSED=1\n")  # the same command, an engine that takes 2 drafts
    u.manager.systemctl("stop", u.unit)
    mark = OutputMark.take(str(u.fragment), u.dropins)
    cmd = " ".join([*GENREADY, "simulate", "--profile", "vllm", "--port", str(u.port), "--api-key", KEY,
                    "--speculative-config", "'{\"method\": \"eagle\", \"num_speculative_tokens\": 3}'",
                    "--engine-report", "speculative_config.num_speculative_tokens=2"])
    u.dropin(f"[Service]\nExecStart=\nExecStart={cmd}\n")
    manager.systemctl("start", u.unit)
    wait_for(lambda: http(f"http://127.0.0.1:{u.port}/health")[0] == 200, 30, "vllm healthy")
    got, conf = u.confirm(mark)
    assert [(m.key, m.expected, m.reported) for m in conf.mismatches] == [
        ("speculative_config.num_speculative_tokens", "3", 2)], got


def test_llamacpp_reports_props_and_slots_and_an_unreported_setting_is_unconfirmed(
        manager: UserManager, tmp_path: Path, units: list[SimUnit]) -> None:
    u = SimUnit(manager, tmp_path, "ec-llama", "llamacpp", "--model", "tiny.gguf", "--parallel", "2",
                "--spec-type", "draft-simple", "--spec-draft-n-max", "8")
    units.append(u)
    mark = u.start()
    complete(u.port, KEY)
    got, conf = u.confirm(mark)
    assert got.sources == ["GET /props", "GET /slots"], got
    assert conf.confirmed == {"model_path": "tiny.gguf", "total_slots": 2, "speculative.types": "none,draft-simple"}
    assert conf.unconfirmed == (("--spec-draft-n-max", "speculative.n_max", "8"),)
    assert ec.verdict(conf).status is None and "--spec-draft-n-max 8" in ec.verdict(conf).warnings[0]


@pytest.mark.system
@pytest.mark.real_servers
def test_the_real_llama_server_reports_its_model_and_spec_types_but_not_its_draft_n_max(tmp_path: Path) -> None:
    """llama-server 11434: /props has model_path and total_slots, but its params' speculative.types say "none"
    whatever the flags; /slots has the real types once a task ran; --spec-draft-n-max is reported nowhere."""
    ci.require(realservers.missing("llama-server"), "a test of the real llama-server")
    models = realservers.cache_dir() / "models"
    found = sorted(models.glob("tiny-*.gguf"))[:1] + sorted(models.glob("draft-copy-*.gguf"))[:1]
    ci.require(None if len(found) == 2 else f"no tiny models in {models} (`./dev real-servers` makes them)",
               "a test of the real llama-server")
    tiny, draft = found
    port = free_port()
    args = ["-m", str(tiny), "-md", str(draft), "--spec-type", "draft-simple", "--spec-draft-n-max", "4",
            "--spec-draft-n-max", "7", "-np", "1", "-c", "2048", "-lm", "none", "-t", "1", "--port", str(port)]
    proc = subprocess.Popen([str(realservers.llama_server()), *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: http(f"http://127.0.0.1:{port}/health")[0] == 200, 60, "llama-server loaded")
        props = http(f"http://127.0.0.1:{port}/props")[1]
        assert props["default_generation_settings"]["params"]["speculative.types"] == "none"  # not the flags'
        complete(port)
        target = config.parse({"targets": {"t": {"unit": "x.service", "url": f"http://127.0.0.1:{port}"}}},
                              service=False).targets["t"]
        read = kinds.LLAMA_CPP.engine
        assert read is not None
        got = servercache.engine_config(servercache.ServerHttp(target), read)
        conf = ec.compare(read, ec.expected(read, args), got.values)
        assert conf.confirmed == {"model_path": str(tiny), "total_slots": 1, "speculative.types": "none,draft-simple"}
        assert conf.unconfirmed == (("--spec-draft-n-max", "speculative.n_max", "7"),) and conf.mismatches == ()
        assert got.values["speculative"] is True
    finally:
        proc.terminate()
        proc.wait(10)



def _fake_journalctl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str) -> None:
    # No journald on these machines: a journalctl that prints what a unit's journal would (as test_unitlog does)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "journalctl"
    fake.write_text("#!/bin/sh\n" + script)
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


@pytest.mark.system
def test_without_output_files_the_args_line_comes_from_the_journal(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_journalctl(tmp_path, monkeypatch, "seq 1 50000\necho \"(APIServer pid=9) INFO [api_utils.py:273] "
                     "non-default args: {'tensor_parallel_size': 4, 'api_key': ['sk-zz']}\"\nseq 1 10\n")
    line = OutputMark(0.0).first_line("user", "v.service", ec.ARGS_MARK)
    assert line is not None and "sk-zz" not in line
    assert ec.vllm_args_line(line) == {"tensor_parallel_size": 4, "api_key": "***"}


@pytest.mark.system
def test_a_journalctl_that_hangs_is_killed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_journalctl(tmp_path, monkeypatch, "echo started\nexec sleep 60\n")
    monkeypatch.setattr(unitlog, "JOURNALCTL_TIMEOUT", 0.5)
    t0 = time.monotonic()
    assert OutputMark(0.0).first_line("user", "v.service", ec.ARGS_MARK) is None
    assert time.monotonic() - t0 < 10
