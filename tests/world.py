"""A genready unit of the module's private manager watching many targets, set up once per module by
the end-to-end modules (test_server_access.py on simulators, test_llamacpp.py on the real servers):
what their tests ask of it. Each module's `World` adds its own fields."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from genready_dev.harness import GENREADY, http, wait_for
from genready_dev.usermanager import UserManager
from tests.pki import Pki


@dataclass
class World:
    manager: UserManager
    tmp: Path  # the servers' units write their output to TMP/UNIT.log
    pki: Pki
    port: int  # genready's API
    config: Path
    log: Path

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def status(self) -> dict[str, Any]:
        code, body = http(self.base + "/status")
        assert code == 200, (code, body, self.log.read_text()[-3000:])
        return body  # type: ignore[no-any-return]

    def target(self, name: str) -> dict[str, Any]:
        t: dict[str, Any] = self.status()["targets"][name]
        return t

    def unit_log(self, name: str) -> str:
        """The last lines the unit of target NAME wrote."""
        unit = self.target(name)["unit"].removesuffix(".service")
        p = self.tmp / f"{unit}.log"
        return p.read_text()[-1500:] if p.exists() else "(none)"

    def wait_state(self, name: str, state: str, timeout: float = 60) -> dict[str, Any]:
        def now() -> str:
            t = self.target(name)
            return f"{t['state']}: {t['reason']} (last_error {t['last_error']!r}); unit log: {self.unit_log(name)}"
        return wait_for(lambda: (t := self.target(name))["state"] == state and t, timeout,
                        lambda: f"{name} in state {state} (now {now()})")

    def wait_error(self, name: str, prefix: str, timeout: float = 60) -> str:
        def last() -> str | None:
            err = self.target(name)["last_error"]
            return err if err and err.startswith(prefix) else None
        return wait_for(last, timeout, lambda: f"{name}: a last_error starting with {prefix!r} (now "
                                               f"{self.target(name)['last_error']!r})")

    def metric(self, name: str, target: str, label: str = "result") -> dict[str, float]:
        """{label value: sample} of one metric for one target, from /metrics."""
        _, text = http(self.base + "/metrics")
        out: dict[str, float] = {}
        for line in str(text).splitlines():
            if line.startswith(name + "{") and f'target="{target}"' in line:
                m = re.search(rf'{label}="([^"]*)"', line)
                if m:
                    out[m.group(1)] = float(line.rsplit(" ", 1)[1])
        return out

    def cli(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """`genready ARGS` against the module's manager (or with `env`)."""
        return subprocess.run([*GENREADY, *args], env=env or self.manager.env, capture_output=True, text=True,
                              timeout=60)
