"""Loads that say how long they usually take, and failed starts that say why: a real genready
daemon against simulator units (and a unit that dies loading) in the private user manager."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from genready_dev.harness import Genready, free_port, http, sim_unit, wait_for
from genready_dev.hostile import huge_output_failure
from genready_dev.usermanager import UserManager

FAST = {"backoff_initial": 0.05, "backoff_max": 0.2, "probe_timeout": 2.0, "verify_owner": False}


def gauge(base: str, target: str, name: str = "genready_expected_load_seconds") -> float:
    _, text = http(base + "/metrics")
    m = re.search(rf'^{name}{{target="{target}",unit="[^"]+"}} (\S+)$', str(text), re.M)
    assert m, text
    return float(m.group(1))


def test_expected_load_and_eta_after_a_few_loads(manager: UserManager, tmp_path: Path) -> None:
    port, unit = free_port(), "ld-sim.service"
    manager.install_unit(unit, sim_unit(port, "--load-seconds", "1.5"))
    g = Genready(manager, tmp_path, {"sim": {"unit": unit, "url": f"http://127.0.0.1:{port}", **FAST}})
    try:
        with g:
            assert g.status()["targets"]["sim"]["expected_load_seconds"] is None
            assert math.isnan(gauge(g.base, "sim"))
            pids: set[int] = set()
            for _ in range(3):
                manager.systemctl("restart", unit)
                pid = wait_for(lambda: (p := g.ready_pid("sim")) not in (None, *pids) and p, 30, "a verified load")
                pids.add(pid)
            t = g.status()["targets"]["sim"]
            loads = sorted(r["load_seconds"] for r in t["records"] if r["load_seconds"] is not None)[-3:]
            assert len(loads) == 3 and all(1.4 < s < 15 for s in loads)
            assert t["expected_load_seconds"] == loads[1]  # the median
            assert gauge(g.base, "sim") == loads[1]
            assert math.isnan(gauge(g.base, "sim", "genready_loading_seconds"))  # ready: not loading
            assert t["records"][0]["exec_fingerprint"]
            # mid-load, /ready's 503 says how long it usually takes and how long is left
            manager.systemctl("restart", unit)
            def mid_load() -> dict[str, Any] | None:
                code, body = g.get("/ready/sim")
                return body if code == 503 and body.get("loading_seconds") is not None else None

            body = wait_for(mid_load, 10, "a 503 mid-load")
            assert body["expected_load_seconds"] == loads[1]
            assert 0 <= body["eta_seconds"] <= loads[1] and body["loading_seconds"] >= 0
            assert abs(body["loading_seconds"] + body["eta_seconds"] - loads[1]) < 0.5 or body["eta_seconds"] == 0
            # The gauge alerts compare with the expected load (GenreadyLoadFarPastExpected): the same clock.
            assert body["loading_seconds"] <= gauge(g.base, "sim", "genready_loading_seconds") < loads[1] + 5
    finally:
        manager.remove_unit(unit)


def test_a_failed_start_shows_its_result_and_its_own_last_words(manager: UserManager, tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("own-key-4711\n")
    out = tmp_path / "server.out"
    script = tmp_path / "server.sh"
    script.write_text("#!/bin/sh\n"
                      "for i in $(seq 1 30); do echo \"loading shard $i\"; done\n"
                      "echo \"server_args=ServerArgs(model_path='m', api_key='sk-sglang-secret', port=1)\"\n"
                      "echo 'Authorization: Bearer sk-bearer-secret HF_TOKEN=hf_secret own-key-4711'\n"
                      "echo 'CUDA out of memory while loading shard 3' >&2\n"
                      "exit 3\n")
    script.chmod(0o755)
    unit = "ld-bad.service"
    out.write_text("an older start's line\n")
    manager.install_unit(unit, f"[Service]\nExecStart={script}\nStandardOutput=append:{out}\n"
                               f"StandardError=append:{out}\n")
    g = Genready(manager, tmp_path, {"bad": {"unit": unit, "url": f"http://127.0.0.1:{free_port()}",
                                             "api_key_file": str(key), **FAST}})
    try:
        with g:
            wait_for(lambda: g.status()["targets"]["bad"]["state"] == "inactive", 10, "the unit inactive")
            manager.systemctl("start", unit, check=False)
            f = wait_for(lambda: (x := g.status()["targets"]["bad"]["last_failure"]) and x["journal"] and x, 15,
                         "the failed start's lines in /status")
            assert (f["result"], f["exit_code"], f["exit_status"]) == ("exit-code", "exited", 3)
            lines = f["journal"]
            assert len(lines) == 20 and lines[-1] == "CUDA out of memory while loading shard 3"
            assert "an older start's line" not in lines  # only that start's lines
            text = "\n".join(lines)
            for secret in ("sk-sglang-secret", "sk-bearer-secret", "hf_secret", "own-key-4711"):
                assert secret not in text
            assert "api_key=***" in text and "Bearer ***" in text
    finally:
        manager.remove_unit(unit)



def test_a_failed_start_of_a_huge_output_file_is_read_from_its_tail(manager: UserManager, tmp_path: Path) -> None:
    """200 MB of output before a start that fails while genready runs (started mid-load, so it has
    no mark of where the start's lines begin): genready, a unit with MemoryMax=256M as shipped (and a
    256 MiB memory cgroup where the host has one), stays small and shows the last lines."""
    r = huge_output_failure(manager, tmp_path, 200 << 20)
    print(f"genready RSS before the failure {r.rss_before_kb / 1024:.1f} MB, peak {r.peak_kb / 1024:.1f} MB "
          f"(memory cgroup: {r.cgroup or 'none'})")
    assert r.lines[-2:] == ["loading shard 30", "CUDA out of memory while loading shard 3"], r.lines
    assert r.survived, "genready was killed (OOM?) or restarted while reading the failed start's lines"
    assert r.peak_kb < 80 * 1024, f"genready's peak RSS {r.peak_kb} kB"
