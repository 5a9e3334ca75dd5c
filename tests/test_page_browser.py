"""The status page at `/` in a real browser (Debian's headless Chromium, tests/browser.py) against a
real genready following a real systemd manager: a simulator unit that loads for a while, and a unit
whose failed start wrote markup and escape sequences.

The screenshot is kept as tmp_path/status-page.png; docs/status-page.png (the README's) is a copy of
one such run."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from genready.redact import escape
from genready_dev import nvidia_smi
from genready_dev.harness import Genready, free_port, show, sim_unit, wait_for
from genready_dev.usermanager import UserManager, _hierarchies
from tests.browser import Browser

pytestmark = pytest.mark.system

SIM, BROKEN = "pb-sim.service", "pb-broken.service"
FAST = {"backoff_initial": 0.05, "backoff_max": 0.2, "probe_timeout": 2.0}
LOAD = 2.5  # seconds each simulator start loads: longer than one refresh of the page, so `loading` shows
HOSTILE_LINE = """<img src=x onerror="window.pwned=1;document.title='pwned'"> and </pre><b>bold</b>"""
ESCAPES = "\x1b[2J\x1b]0;pwned\x07 cleared"


def broken_unit(tmp: Path) -> str:
    """A unit whose process writes markup and escape sequences, then exits 3, leaving a child behind
    (KillMode=process) that the stand-in nvidia-smi says holds GPU memory: a stray of that start."""
    out, script = tmp / "broken.out", tmp / "broken.sh"
    script.write_text("#!/bin/sh\n"
                      "echo 'loading /models/typo'\n"
                      f"cat <<'EOF'\n{HOSTILE_LINE}\nEOF\n"
                      "printf '\\033[2J\\033]0;pwned\\007 cleared\\n'\n"
                      "sleep 600 >/dev/null 2>&1 &\n"
                      "exit 3\n")
    script.chmod(0o755)
    return (f"[Unit]\nStartLimitIntervalSec=0\n[Service]\nExecStart={script}\nKillMode=process\n"
            f"StandardOutput=append:{out}\nStandardError=append:{out}\n")


@pytest.fixture
def served(manager: UserManager, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Genready]:
    port = free_port()
    smi = tmp_path / "smi.json"  # the stand-in nvidia-smi on genready's PATH (these machines have no GPU)
    nvidia_smi.write_state(smi, {"gpus": [], "apps": []})
    nvidia_smi.install(tmp_path / "bin", smi)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    manager.install_unit(SIM, sim_unit(port, "--load-seconds", str(LOAD)))
    manager.install_unit(BROKEN, broken_unit(tmp_path))
    manager.systemctl("start", SIM)
    g = Genready(manager, tmp_path, {
        "sim": {"unit": SIM, "url": f"http://127.0.0.1:{port}", **FAST},
        "broken": {"unit": BROKEN, "url": f"http://127.0.0.1:{free_port()}", **FAST, "verify_owner": False},
    }, gpu_interval=0.5).start()
    try:
        manager.systemctl("start", BROKEN, check=False)  # it fails: that start's lines are the test's
        wait_for(lambda: g.ready_pid("sim") is not None, 30, "sim verified")
        wait_for(lambda: (f := g.status()["targets"]["broken"]["last_failure"]) and len(f["journal"]) >= 3,
                 20, "broken's failed start and its lines in /status")
        cgroup = _hierarchies()[0] / manager.show(BROKEN, "ControlGroup")["ControlGroup"].lstrip("/")
        (left,) = wait_for(lambda: (cgroup / "cgroup.procs").read_text().split() or None, 10, "the child left")
        nvidia_smi.write_state(smi, {"gpus": [], "apps": [{"gpu_uuid": "GPU-0", "pid": int(left), "used_mib": 5000}]})
        wait_for(lambda: (g.status()["targets"]["broken"]["gpu"] or {}).get("strays"), 20,
                 lambda: f"the stray {left} in /status: {g.status()['targets']['broken']['gpu']}; log: {g.log()}")
        yield g
    finally:
        manager.systemctl("kill", "--kill-whom=all", "--signal=SIGKILL", BROKEN, check=False)
        g.stop()
        manager.systemctl("stop", SIM, BROKEN, check=False)
        manager.systemctl("reset-failed", BROKEN, check=False)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    b = Browser(tmp_path / "chromium-profile").start()
    try:
        yield b
    finally:
        b.stop()


def shown(b: Browser) -> dict[str, dict[str, Any]]:
    """Each target card's state and PID as the page shows them."""
    cards: dict[str, dict[str, Any]] = b.js("""Object.fromEntries([...document.querySelectorAll("[data-target]")]
        .map((c) => [c.dataset.target, {state: c.querySelector("[data-field=state]").textContent,
                                         pid: c.querySelector("[data-field=pid]").textContent}]))""")
    return cards


def test_the_page_in_chromium(served: Genready, browser: Browser, tmp_path: Path, manager: UserManager) -> None:
    browser.navigate(served.base + "/")
    wait_for(lambda: browser.js("document.body && document.body.dataset.drawn") is not None, 10, "the page drawn")

    # 1. Every target's state shows, and is /status's.
    def same() -> bool:
        st = served.status()["targets"]
        want = {n: {"state": t["state"], "pid": str(t["pid"]) if t["pid"] else "–"} for n, t in st.items()}
        return shown(browser) == want
    wait_for(same, 10, lambda: f"the page's states {shown(browser)} as /status's")
    assert shown(browser)["sim"]["state"] == "ready" and shown(browser)["broken"]["state"] == "inactive"

    # 2. The failed start's lines show as text: no element made of them, no handler run.
    journal = browser.js('document.querySelector("[data-target=broken] [data-field=journal]").textContent')
    assert HOSTILE_LINE in journal and escape(ESCAPES) in journal and "\x1b" not in journal, journal
    assert browser.js("document.querySelectorAll('img').length") == 0
    assert browser.js("[...document.querySelectorAll('pre b, main b')].some((b) => b.textContent === 'bold')") is False
    assert browser.js("window.pwned === undefined && document.title.startsWith('genready')") is True
    # The stray its start left, holding GPU memory, is on its card.
    (stray,) = served.status()["targets"]["broken"]["gpu"]["strays"]
    held = browser.js('document.querySelector("[data-target=broken] [data-field=gpu]").textContent')
    assert f"stray PID {stray['pid']} holds 4.9 GiB on GPU-0" in held and "sleep 600" in held, held
    # The page's escape is the CLI's, for every kind of control character.
    hostile = "osc52 \x1b]52;c;cHduZWQ=\x07 c1 \x9b2J del \x7f \u2028 \u202e tab\t"
    assert browser.js(f"window.genreadyEscape({json.dumps(hostile)})") == escape(hostile)

    # 3. A restart: the page shows loading, then ready with the new PID, within 3 s of /status.
    old_pid, _ = show(manager, SIM)
    manager.systemctl("restart", "--no-block", SIM)
    seen: dict[str, float] = {}
    new_pid = 0

    def restarted() -> bool:
        nonlocal new_pid
        now = time.monotonic()
        st = served.status()["targets"]["sim"]
        page = shown(browser)["sim"]
        if st["state"] == "loading" and st["pid"] not in (None, old_pid):
            seen.setdefault("status loading", now)
        if page["state"] == "loading" and page["pid"] not in ("–", str(old_pid)):
            seen.setdefault("page loading", now)
        if st["state"] == "ready" and st["pid"] not in (None, old_pid):
            seen.setdefault("status ready", now)
            new_pid = st["pid"]
        if "status ready" in seen and page == {"state": "ready", "pid": str(new_pid)}:
            seen.setdefault("page ready", now)
        return "page ready" in seen
    wait_for(restarted, 30, lambda: f"the page through the restart (seen: {seen})")
    assert {"status loading", "page loading", "status ready", "page ready"} <= set(seen), seen
    assert seen["page loading"] - seen["status loading"] <= 3.0, seen
    assert seen["page ready"] - seen["status ready"] <= 3.0, seen
    assert new_pid != old_pid
    print(f"page behind /status: loading {seen['page loading'] - seen['status loading']:.2f} s, "
          f"ready {seen['page ready'] - seen['status ready']:.2f} s")
    # The timeline shows both starts of sim, the older one ended after it was ready.
    outcomes = browser.js('[...document.querySelectorAll("[data-target=sim] [data-outcome]")]'
                          ".map((r) => r.dataset.outcome)")
    assert outcomes[:2] == ["serving", "served"], outcomes
    assert browser.js('document.querySelector("[data-target=broken] [data-outcome]").dataset.outcome') == "failed"

    # 4. The screenshot, then: nothing in the console, and no request left 127.0.0.1.
    shot = tmp_path / "status-page.png"
    browser.screenshot(shot)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    assert browser.console_errors == [], browser.console_errors
    base = served.base + "/"
    assert browser.requests[0] == base and browser.requests.count(served.base + "/status") >= 2, browser.requests
    assert all(u.startswith(served.base + "/") or u.startswith("data:") for u in browser.requests), browser.requests

    # 5. A frozen genready (SIGSTOP): the kernel still accepts the page's connection and nothing answers.
    # Each request's deadline makes the page say "stale since" within 5 s; after SIGCONT it draws again.
    assert served.proc is not None
    stale_note = 'document.getElementById("stale").textContent'
    os.kill(served.proc.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        wait_for(lambda: "stale since" in browser.js(stale_note), 10, "the page to say stale")
        delay = time.monotonic() - stopped
        note = browser.js(stale_note)
    finally:
        os.kill(served.proc.pid, signal.SIGCONT)
    print(f"page stale {delay:.2f} s after SIGSTOP: {note}")
    assert delay <= 5.0 and "did not answer within" in note, (delay, note)
    assert browser.js("document.body.classList.contains('stale')") is True
    wait_for(lambda: browser.js(stale_note) == "" and shown(browser)["sim"]["state"] == "ready", 10,
             "the page drawn again after SIGCONT")
