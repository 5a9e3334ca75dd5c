"""Real container engines for the tests: a registry-free image, unit files that run the simulator
in a container, and cleanup of every container a test made. The one home of docker/podman specifics.

The image is an empty root (etc tmp proc sys dev) imported with `docker import`; the host's /usr,
/lib, /lib64, /bin and this checkout with its interpreter are bind-mounted read-only, so the
simulator runs inside exactly as on the host.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

from tests.helpers import PY, code_paths

IMAGE = "genready-test:1"
DOCKER = "/usr/bin/docker"  # not a newer client earlier on PATH: the unit and the test use one binary
PODMAN = "/usr/bin/podman"
PREFIX = "genready-test-"  # every container a test starts is named so, and removed by it


def _empty_root_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for d in ("etc", "tmp", "proc", "sys", "dev"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
    return buf.getvalue()


def mounts() -> list[str]:
    binds = [Path("/usr"), Path("/lib"), Path("/lib64"), Path("/bin"), *code_paths()]
    return [arg for p in binds if p.exists() for arg in ("-v", f"{p}:{p}:ro")]


class Docker:
    """The docker CLI against the host's dockerd."""

    def __init__(self) -> None:
        self.cli = DOCKER

    def run(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.cli, *args], capture_output=True, text=True, check=check, timeout=timeout)

    @staticmethod
    def unavailable() -> str | None:
        """Why docker cannot run containers here, or None."""
        if not shutil.which(DOCKER) or not Path("/usr/sbin/dockerd").exists():
            return "docker.io is not installed (./dev setup installs it)"
        try:
            r = subprocess.run([DOCKER, "info", "--format", "{{.ServerVersion}}"], capture_output=True,
                               text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"docker info failed: {e}"
        return None if r.returncode == 0 else f"dockerd is not running: {r.stderr.strip()[:200]}"

    def ensure_image(self) -> None:
        if self.run("image", "inspect", IMAGE, check=False).returncode != 0:
            subprocess.run([self.cli, "import", "-", IMAGE], input=_empty_root_tar(), capture_output=True,
                           check=True, timeout=60)

    def simulate_args(self, name: str, port: int, *sim: str, network: str = "") -> list[str]:
        """`docker run` arguments for the simulator in container `name`: published on 127.0.0.1:port,
        or on the host's network with network="host"."""
        net = ["--network", network] if network else ["-p", f"127.0.0.1:{port}:{port}"]
        host = "127.0.0.1" if network == "host" else "0.0.0.0"
        return ["run", "--rm", "--name", name, *net, *mounts(), IMAGE,
                PY, "-m", "genready.cli", "simulate", "--host", host, "--port", str(port), *sim]

    def unit(self, name: str, port: int, *sim: str, network: str = "", log: Path, stop_timeout: float = 10) -> str:
        """A unit running the simulator in container `name` the way SGLang's docker units do."""
        return f"""[Unit]
StartLimitIntervalSec=0

[Service]
ExecStart={self.cli} {' '.join(self.simulate_args(name, port, *sim, network=network))}
Restart=always
RestartSec=0.2
TimeoutStopSec={stop_timeout:g}
StandardOutput=append:{log}
StandardError=append:{log}
"""

    def inspect(self, name: str) -> dict[str, Any] | None:
        r = self.run("inspect", name, check=False)
        if r.returncode != 0:
            return None
        doc: list[dict[str, Any]] = json.loads(r.stdout)
        return doc[0]

    def remove_test_containers(self) -> None:
        r = self.run("ps", "-aq", "--filter", f"name={PREFIX}", check=False)
        ids = r.stdout.split()
        if ids:
            with contextlib.suppress(subprocess.SubprocessError):
                self.run("rm", "-f", *ids, check=False)
