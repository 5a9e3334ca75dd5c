"""A real Prometheus server for a test: Debian's `prometheus` binary (the package `./dev` installs
for promtool) on a free loopback port, its storage in the test's temp dir, asked over its HTTP API.

It is stopped when the `with` block ends, whatever happened inside; `setpriv --pdeathsig` also
has the kernel send it SIGTERM should the test process die before it can (a killed pytest must
not leave a server scraping on the host).
"""

from __future__ import annotations

import json
import math
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from genready_dev.harness import free_port, stop_process, wait_for
from tests import ci


class PrometheusError(AssertionError):
    """Prometheus answered, and not with `status: success` (a query that does not parse, say)."""


class PrometheusServer:
    """`prometheus` with `config` (the text of a prometheus.yml), under `tmp`."""

    def __init__(self, tmp: Path, config: str) -> None:
        self.binary = ci.tool("prometheus", "Debian/Ubuntu: apt-get install prometheus")
        self.setpriv = ci.tool("setpriv", "util-linux")
        self.dir = tmp / "prometheus"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.config = self.dir / "prometheus.yml"
        self.config.write_text(config)
        self.port = free_port()
        self.log_path = self.dir / "prometheus.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> PrometheusServer:
        argv = [self.setpriv, "--pdeathsig", "TERM", self.binary,
                f"--config.file={self.config}", f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                # Debian's defaults point at /etc/prometheus; nothing of the host's is read.
                f"--web.console.templates={self.dir}", f"--web.console.libraries={self.dir}",
                "--log.level=warn"]
        with self.log_path.open("ab") as log:
            # setpriv execs prometheus in place: proc.pid is the server's own pid.
            self.proc = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        try:
            wait_for(lambda: self._answers() or self.proc is None or self.proc.poll() is not None, 30,
                     "Prometheus's /-/ready")
            assert self.proc.poll() is None, f"prometheus exited {self.proc.returncode}:\n{self.log()}"
        except BaseException:
            self.stop()
            raise
        return self

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(self.base + "/-/ready", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def stop(self) -> int | None:
        """SIGTERM (Prometheus flushes its head block and exits), SIGKILL after 10 s; its exit status."""
        return None if self.proc is None else stop_process(self.proc)

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def api(self, path: str, **params: str | float) -> Any:
        """GET /api/v1/PATH?params; the `data` of a success, else PrometheusError with Prometheus's own words."""
        url = f"{self.base}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode({k: str(v) for k, v in params.items()})
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.loads(r.read())
        except urllib.error.HTTPError as e:  # 400 bad_data, 422 execution: the body says why
            body = json.loads(e.read() or b"{}")
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, **params: str | float) -> list[dict[str, Any]]:
        """An instant query's vector (scalars and strings come back as one sample without labels)."""
        data = self.api("query", query=expr, **params)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        result: list[dict[str, Any]] = data["result"]
        return result

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """A range query's matrix: what a Grafana time-series panel asks for."""
        result: list[dict[str, Any]] = self.api("query_range", query=expr, start=start, end=end, step=step)["result"]
        return result

    def targets(self) -> list[dict[str, Any]]:
        active: list[dict[str, Any]] = self.api("targets", state="active")["activeTargets"]
        return active

    def rules(self) -> list[dict[str, Any]]:
        return [r for g in self.api("rules")["groups"] for r in g["rules"]]


def values(series: list[dict[str, Any]]) -> list[float]:
    """Every sample value of a query's result (instant or range), as floats (NaN included)."""
    out: list[float] = []
    for s in series:
        for _, v in s.get("values") or [s["value"]]:
            out.append(float(v))
    return out


def finite(series: list[dict[str, Any]]) -> list[float]:
    """The values a panel can draw: NaN (0/0 of an empty window) and ±Inf draw nothing."""
    return [v for v in values(series) if math.isfinite(v)]
