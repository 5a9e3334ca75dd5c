"""Real container engines for the tests: a registry-free root, unit files that run the simulator in
a container, the engine's API, and cleanup of every container a test made. The one home of
docker/podman specifics; the fixtures in conftest.py only call into it.

The root is empty (etc tmp proc sys dev): docker imports it as an image, podman runs it with
--rootfs. The host's /usr, /lib, /lib64, /bin and this checkout with its interpreter are
bind-mounted read-only, so the simulator runs inside exactly as on the host.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from genready_dev.harness import PY, code_paths, wait_for

# Every container a test starts is named (or labelled) so, and removed. The pid keeps test sessions
# running at once on one host (one dockerd) from sharing names and removing each other's containers.
PREFIX = f"genready-test-{os.getpid()}-"
DIRS = ("etc", "tmp", "proc", "sys", "dev")


def mounts() -> list[str]:
    binds = [Path("/usr"), Path("/lib"), Path("/lib64"), Path("/bin"), *code_paths()]
    return [arg for p in binds if p.exists() for arg in ("-v", f"{p}:{p}:ro")]


class Engine:
    """What the docker and podman CLIs share; subclasses say how to start and where the root is."""

    cli = ""  # the absolute path: a newer client earlier on PATH must not differ from the unit's
    global_args: tuple[str, ...] = ()
    socket = ""  # the engine's API, for genready's container_socket

    @classmethod
    def unavailable(cls) -> str | None:
        """Why this engine cannot run containers here, or None."""
        raise NotImplementedError

    def run(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.cli, *self.global_args, *args], capture_output=True, text=True,
                              check=check, timeout=timeout)

    def run_args(self) -> list[str]:
        """Flags of `run` particular to this engine on these machines."""
        return []

    def root(self) -> list[str]:
        """The image (or --rootfs DIR), the last thing before the command."""
        raise NotImplementedError

    def simulate_args(self, name: str, port: int, *sim: str, network: str = "",
                      extra: tuple[str, ...] = ()) -> list[str]:
        """`run` arguments for the simulator in container `name` (no --name if empty): published
        on 127.0.0.1:port, or on the host's network with network="host"."""
        net = ["--network", network] if network else ["-p", f"127.0.0.1:{port}:{port}"]
        host = "127.0.0.1" if network == "host" else "0.0.0.0"
        named = ["--name", name] if name else []
        return ["run", "--rm", *named, *self.run_args(), *extra, *net, *mounts(), *self.root(),
                PY, "-m", "genready.cli", "simulate", "--host", host, "--port", str(port), *sim]

    def command(self, args: list[str]) -> str:
        return " ".join([self.cli, *self.global_args, *args])

    def unit(self, name: str, port: int, *sim: str, log: Path, stop_timeout: float = 10, network: str = "",
             extra: tuple[str, ...] = (), service: str = "") -> str:
        """A unit running the simulator in container `name` the way SGLang's container units do."""
        return f"""[Unit]
StartLimitIntervalSec=0

[Service]
ExecStart={self.command(self.simulate_args(name, port, *sim, network=network, extra=extra))}
Restart=always
RestartSec=0.2
TimeoutStopSec={stop_timeout:g}
StandardOutput=append:{log}
StandardError=append:{log}
{service}
"""

    def inspect(self, name: str) -> dict[str, Any] | None:
        r = self.run("inspect", name, check=False)
        if r.returncode != 0:
            return None
        doc: list[dict[str, Any]] = json.loads(r.stdout)
        return doc[0] if doc else None

    def remove_test_containers(self) -> None:
        ids: set[str] = set()
        for flt in (f"name={PREFIX}", f"label={PREFIX}"):
            ids |= set(self.run("ps", "-aq", "--filter", flt, check=False).stdout.split())
        if ids:
            with contextlib.suppress(subprocess.SubprocessError):
                self.run("rm", "-f", *sorted(ids), check=False)

    def close(self) -> None:
        self.remove_test_containers()


class Docker(Engine):
    """The host's dockerd (./dev setup installs docker.io and starts it)."""

    cli = "/usr/bin/docker"
    socket = "/var/run/docker.sock"
    IMAGE = "genready-test:1"

    @classmethod
    def unavailable(cls) -> str | None:
        """Why docker cannot run containers here, or None."""
        if not shutil.which(cls.cli) or not Path("/usr/sbin/dockerd").exists():
            return "docker.io is not installed (./dev setup installs it)"
        try:
            r = subprocess.run([cls.cli, "info", "--format", "{{.ServerVersion}}"], capture_output=True,
                               text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"docker info failed: {e}"
        return None if r.returncode == 0 else f"dockerd is not running: {r.stderr.strip()[:200]}"

    def __init__(self) -> None:
        if self.run("image", "inspect", self.IMAGE, check=False).returncode != 0:
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as tar:
                for d in DIRS:
                    info = tarfile.TarInfo(d)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
            subprocess.run([self.cli, "import", "-", self.IMAGE], input=buf.getvalue(), capture_output=True,
                           check=True, timeout=60)
        self.remove_test_containers()

    def root(self) -> list[str]:
        return [self.IMAGE]


class Podman(Engine):
    """Debian's podman, rootful, no image (--rootfs), with its API served for the session."""

    cli = "/usr/bin/podman"
    # The private systemd manager's namespace has /run/systemd/system, so podman would pick the
    # systemd cgroup manager and want the system bus, which these machines do not have.
    global_args = ("--cgroup-manager=cgroupfs",)

    @classmethod
    def unavailable(cls) -> str | None:
        if not shutil.which(cls.cli):
            return "podman is not installed (./dev setup installs it)"
        return None

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="genready-podman-"))
        self.rootfs = self.dir / "root"
        for d in DIRS:
            (self.rootfs / d).mkdir(parents=True)
        self.socket = str(self.dir / "podman.sock")
        self.remove_test_containers()
        self.service = subprocess.Popen([self.cli, *self.global_args, "system", "service", "--time=0",
                                         f"unix://{self.socket}"], stdout=subprocess.DEVNULL,
                                        stderr=(self.dir / "service.log").open("ab"), start_new_session=True)
        # The socket, or the service's exit: a service that died is said at once, not at the deadline.
        with contextlib.suppress(AssertionError):  # out of time: said below, with the service's log
            wait_for(lambda: Path(self.socket).exists() or self.service.poll() is not None, 20,
                     "podman system service's API socket")
        if not Path(self.socket).exists():
            self.close()
            raise RuntimeError(f"podman system service did not start: {(self.dir / 'service.log').read_text()}")

    def run_args(self) -> list[str]:
        # These machines deny CAP_SYS_RESOURCE: runc cannot give the container podman's default
        # RLIMIT_NOFILE/NPROC (above our hard limits), so ask for lower ones explicitly.
        return ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1000:1000"]

    def root(self) -> list[str]:
        return ["--rootfs", str(self.rootfs)]

    def close(self) -> None:
        super().close()
        if self.service.poll() is None:
            self.service.send_signal(signal.SIGTERM)
            try:
                self.service.wait(10)
            except subprocess.TimeoutExpired:
                self.service.kill()
                self.service.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)
