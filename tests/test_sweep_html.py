"""`genready sweep report --format html`: one self-contained page, checked in a real headless Chromium.

The browser opens the file with name resolution off, takes a screenshot (kept in the test's folder),
and its network log shows every request the page made; the DOM it built shows every plot and a
hostile point value as text.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from genready.exitcodes import Failed
from genready.sweep import html as sweephtml
from genready.sweep import main as sweep
from genready.sweep import report as sweepreport
from genready_dev.harness import PY, REPO
from tests import ci

sys.path.insert(0, str(REPO / "bench"))
import sweep_report_html  # bench/: the 1,000-point timing writes the same folders

HOSTILE = "<script>alert(1)</script>\x1b[31m$x$"


def results(tmp: Path, n: int = 20) -> Path:
    folder = tmp / "results"
    folder.mkdir()
    sweep_report_html.write(folder, n)
    lines = folder.joinpath("results.jsonl").read_text().splitlines()
    for k in range(3):  # point 1's three repeats: a value holding a script tag and an escape sequence
        rec = json.loads(lines[k])
        rec["point"]["draft"] = HOSTILE
        lines[k] = json.dumps(rec)
    folder.joinpath("results.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def test_without_matplotlib_html_exits_69_naming_the_extra_and_other_formats_work(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    folder = results(tmp_path, 4)
    # A machine without matplotlib cannot be had in this process: None in sys.modules makes its import fail.
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(Failed) as e:
        sweep.report_main([str(folder)], "html")
    assert e.value.status == 69 and "genready[report]" in str(e.value) and "python3-matplotlib" in str(e.value)
    for fmt in sweepreport.FORMATS:
        assert sweep.report_main([str(folder)], fmt) == 0
    assert "draft=d1" in capsys.readouterr().out


def test_only_the_html_report_imports_matplotlib() -> None:
    daemon = REPO / "daemon" / "genready"
    importing = sorted(str(p.relative_to(daemon)) for p in daemon.rglob("*.py")
                       if re.search(r"^\s*(import|from) matplotlib", p.read_text(), re.M))
    assert importing == ["sweep/html.py"], importing
    # and the sweep's entry points load that module only for --format html
    assert not re.search(r"^from genready.sweep import .*html", (daemon / "sweep" / "main.py").read_text(), re.M)


def test_the_pareto_front_is_the_points_nothing_beats_on_both() -> None:
    pts = [(10.0, 100.0, "a"), (12.0, 90.0, "b"), (12.0, 150.0, "c"), (20.0, 150.0, "d"), (30.0, 200.0, "e")]
    assert [p[2] for p in sweephtml.pareto_front(pts)] == ["a", "c", "e"]


def test_axes_and_a_bad_axis_flag(tmp_path: Path) -> None:
    rows = sweepreport.rows_of([results(tmp_path, 20)])
    client, _ = sweephtml.axes_of(rows)
    assert "c" in client and sweephtml.default_x(rows) in client
    with pytest.raises(Failed) as e:
        sweep.report_main([str(tmp_path / "results")], "html", x="nope")
    assert e.value.status == 64 and "--x" in str(e.value) and "draft" in str(e.value)


CHROMIUM_FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                  # no name resolution at all: nothing can leave the machine by name
                  "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE localhost , EXCLUDE 127.0.0.1",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-extensions", "--disable-default-apps"]


def chromium(page: Path, out: Path, *what: str) -> tuple[str, list[str]]:
    """(stdout, the URLs the page itself asked for): Chromium's own services (updates, the clock) start
    their requests with no origin ("not an origin" in the network log) and are not the page's."""
    exe = ci.tool("chromium", "apt-get install chromium")
    netlog = out.with_suffix(".netlog.json")
    run = subprocess.run([exe, *CHROMIUM_FLAGS, f"--log-net-log={netlog}", *what, page.as_uri()],
                         capture_output=True, text=True, timeout=120, cwd=out.parent)
    assert run.returncode == 0, run.stderr[-2000:]
    log = json.loads(netlog.read_text())
    start = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    urls = [p["url"] for ev in log["events"] if ev["type"] == start and "url" in (p := ev.get("params", {}))
            and p.get("initiator") != "not an origin"]
    return run.stdout, urls


@pytest.mark.system
def test_the_html_report_in_a_real_browser(tmp_path: Path) -> None:
    folder = results(tmp_path)
    page = tmp_path / "report.html"
    done = subprocess.run([PY, "-m", "genready.cli", "sweep", "report", str(folder), "--format", "html", "--output",
                           str(page)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # the check can fail: a page that loads an image from outside shows in the log
    control = tmp_path / "control.html"
    control.write_text('<html><body><img src="http://example.invalid/x.png"></body></html>')
    assert chromium(control, tmp_path / "control.png", "--dump-dom")[1] == ["http://example.invalid/x.png"]

    dom, asked = chromium(page, tmp_path / "dom.html", "--dump-dom")
    assert asked == [], asked
    plots = re.findall(r'<div class="plot" id="([a-z0-9_-]+)">(.*?)</div>', dom, re.S)
    ids = [i for i, _ in plots]
    assert ids == [f"plot-{k}" for k in sweephtml.PLOTTED] + ["pareto-ttft_p50_ms", "pareto-itl_p50_ms"], ids
    for i, body in plots:
        assert "<svg" in body and body.count("<path") > 20, f"{i}: an empty plot"
    # the hostile value is text: escaped, no element made of it, the escape sequence shown as \x1b
    assert "&lt;script&gt;alert(1)&lt;/script&gt;\\x1b[31m$x$" in dom and "<script" not in dom
    assert "Pareto front: " in dom and "d9 c=2" in dom

    shot = tmp_path / "report.png"
    _, asked = chromium(page, shot, f"--screenshot={shot}", "--window-size=1300,2600")
    assert asked == [] and shot.stat().st_size > 50_000
    png: Any = __import__("matplotlib.image", fromlist=["imread"]).imread(str(shot))
    assert png.std() > 0.05  # not a blank page
    print(f"screenshot: {shot}")
