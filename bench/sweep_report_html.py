"""The time `genready sweep report --format html` takes over a results folder of N points (issue 29: under
5 s for 1,000). The folder is written here: N points of a 10 server settings x N/10 concurrencies plan,
each with a bench line whose figures follow a smooth curve, 3 repeats each.

    .venv/bin/python bench/sweep_report_html.py [N]
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable


def write(folder: Path, n: int, repeats: int = 3) -> None:
    lines = []
    servers = 10
    per = max(1, n // servers)
    for i in range(n):
        s, c = i // per, i % per + 1
        point = {"draft": f"d{s}", "c": c}
        for r in range(1, repeats + 1):
            out = f"{i + 1:04d}-draft=d{s}_c={c}/repeat-{r}/attempt-1"
            (folder / out).mkdir(parents=True)
            tps = 100 * c / (1 + 0.05 * c) * (1 + 0.1 * s) * (1 + 0.01 * r)
            ttft = 10 + 2 * c + s + 0.1 * r
            (folder / out / "bench.jsonl").write_text(json.dumps({
                "accept_length": 1.5 + 0.1 * s, "output_tokens_per_second": tps, "ttft_p50_ms": ttft,
                "ttft_p99_ms": 2 * ttft, "itl_p50_ms": 5 + math.log(c) + 0.01 * r}) + "\n")
            lines.append(json.dumps({"point": point, "index": i + 1, "group": s + 1, "status": "ok", "attempt": 1,
                                     "out": out, "repeat": r, "cache": "flushed" if r > 1 or c > 1 else "cold_start",
                                     "pid": 1000 + s, "invocation_id": f"{s:032x}", "load_seconds": 30.0,
                                     "run_seconds": 5.0, "host": "gpu1", "target": "t", "unit": "sglang.service",
                                     "started_at": "2026-12-04T01:00:00Z", "ended_at": "2026-12-04T02:00:00Z"}))
    (folder / "results.jsonl").write_text("\n".join(lines) + "\n")


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "results"
        folder.mkdir()
        write(folder, n)
        out = Path(tmp) / "report.html"
        t0 = time.perf_counter()
        subprocess.run([PY, "-m", "genready.cli", "sweep", "report", str(folder), "--format", "html", "--output",
                        str(out)], check=True, cwd=REPO)
        took = time.perf_counter() - t0
        print(f"report --format html over {n} points ({n * 3} runs): {took:.2f} s, {out.stat().st_size:,} bytes")
        return 0 if took < 5 else 1


if __name__ == "__main__":
    raise SystemExit(main())
