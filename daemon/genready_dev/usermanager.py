"""A private `systemd --user` manager, for tests, the demo and the benchmarks.

systemd only runs as a user manager if it believes the machine was booted with systemd
(/run/systemd/system exists). On a machine that was not, we give it that belief inside a
private mount namespace, so nothing leaks to the host. Its D-Bus API is the same one the
system manager serves, so genready watches it exactly as it would watch a real host.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Final

SYSTEMD: Final = "/lib/systemd/systemd"

# Each manager moves itself into a cgroup of its own first: otherwise every private manager
# on a host that was not booted with systemd shares one cgroup tree, and a unit of the same
# name in two managers (dbus.service) shares one cgroup, so stopping one waits on the other.
_BOOT = """
for h in {hierarchies}; do
    d=$h/genready-um-$$
    mkdir -p "$d" 2>/dev/null && echo $$ > "$d/cgroup.procs" 2>/dev/null || true
done
mount -t tmpfs tmpfs /run/systemd
mkdir -p /run/systemd/system
# As on a host booted with systemd: mounts shared (new peer groups, inside this namespace only).
# systemd mounts a unit's LoadCredential= directory from a child namespace; under the private
# propagation unshare gave us, the unit would see an empty $CREDENTIALS_DIRECTORY.
mount --make-rshared /
exec {systemd} --user
"""
CGROUP_ROOT: Final = Path("/sys/fs/cgroup")

# A host's system bus admits every uid; a session bus only its owner. Sandboxed test units that
# run as another user (genready.service has DynamicUser=yes) must reach this manager's bus the
# way they reach the system bus, so its dbus-daemon admits any uid too (and the notify socket,
# below, is made world-writable like a host's).
_BUS_CONFIG = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <include>/usr/share/dbus-1/session.conf</include>
  <policy context="default"><allow user="*"/></policy>
</busconfig>
"""


def _hierarchies() -> list[Path]:
    """The cgroup hierarchies systemd uses here: v2 at the root, or name=systemd + unified (hybrid)."""
    if (CGROUP_ROOT / "cgroup.procs").exists():
        return [CGROUP_ROOT]
    return [p for p in (CGROUP_ROOT / "systemd", CGROUP_ROOT / "unified") if (p / "cgroup.procs").exists()]


def unavailable_reason() -> str | None:
    """Why a private user manager cannot run here, or None if it can."""
    if os.geteuid() != 0:
        return "needs root (a private mount namespace for systemd --user)"
    for tool in ("unshare", "systemctl"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if not os.path.exists(SYSTEMD):
        return f"{SYSTEMD} does not exist"
    return None


def _remove_cgroup_tree(top: Path) -> None:
    """rmdir a cgroup and its children, deepest first (cgroupfs only removes empty ones)."""
    if not top.is_dir():
        return
    for dirpath, _, _ in sorted(os.walk(top), key=lambda w: -w[0].count("/")):
        with contextlib.suppress(OSError):
            os.rmdir(dirpath)


class UserManager:
    """One private systemd user manager: start(), use, stop(). Units go to `unit_dir`."""

    def __init__(self, root: Path | None = None) -> None:
        self._own_root = root is None
        self.root = Path(root or tempfile.mkdtemp(prefix="genready-sd-"))
        self.runtime_dir = self.root / "run"
        self.config_home = self.root / "config"
        self.unit_dir = self.config_home / "systemd" / "user"
        self.log_path = self.root / "manager.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def env(self) -> dict[str, str]:
        """Environment for clients (systemctl --user, pystemd user_mode, genready with bus=user)."""
        env = dict(os.environ)
        env.update(
            XDG_RUNTIME_DIR=str(self.runtime_dir),
            XDG_CONFIG_HOME=str(self.config_home),
            DBUS_SESSION_BUS_ADDRESS=f"unix:path={self.runtime_dir}/bus",
        )
        return env

    def start(self, timeout: float = 30.0) -> None:
        """Boot the manager and return once its bus answers; RuntimeError if it never does."""
        self.runtime_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.unit_dir.mkdir(parents=True, exist_ok=True)
        bus_config = self.root / "bus.conf"
        bus_config.write_text(_BUS_CONFIG)
        dropin = self.unit_dir / "dbus.service.d"
        dropin.mkdir(exist_ok=True)
        (dropin / "any-uid.conf").write_text(
            f"[Service]\nExecStart=\nExecStart=/usr/bin/dbus-daemon --config-file={bus_config} --address=systemd: "
            "--nofork --nopidfile --systemd-activation --syslog-only\n")
        env = self.env
        env.pop("NOTIFY_SOCKET", None)  # a manager inside a unit must not notify that unit's manager
        env["SYSTEMD_LOG_TARGET"] = "console"  # there is no journald: keep the manager's log in a file
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                 _BOOT.format(systemd=SYSTEMD, hierarchies=" ".join(map(str, _hierarchies())))],
                env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"systemd --user exited ({self.proc.returncode}); see {self.log_path}")
            # is-system-running says "offline" here even when the manager works; this does not lie.
            if self.systemctl("show-environment", check=False, timeout=5).returncode == 0:
                # A host's /run/systemd/notify admits every uid (a DynamicUser= unit's READY=1);
                # the user manager made its own one 0755.
                (self.runtime_dir / "systemd" / "notify").chmod(0o777)
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"systemd --user did not answer within {timeout}s; see {self.log_path}")

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM the manager (it stops its units first) and wait for it; SIGKILL as a last resort."""
        if self.proc is None or self.proc.poll() is not None:
            return
        pid = self.proc.pid
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(pid, signal.SIGKILL)
            self.proc.wait(10)
        for h in _hierarchies():
            _remove_cgroup_tree(h / f"genready-um-{pid}")
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def systemctl(self, *args: str, check: bool = True, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Run `systemctl --user ARGS` against this manager."""
        return subprocess.run(
            ["systemctl", "--user", *args], env=self.env, check=check, timeout=timeout,
            capture_output=True, text=True,
        )

    def install_unit(self, name: str, text: str) -> Path:
        """Write a unit file and make the manager see it (daemon-reload, which new files don't need)."""
        path = self.unit_dir / name
        existed = path.exists()
        path.write_text(text)
        if existed:
            self.systemctl("daemon-reload")
        return path

    def remove_unit(self, name: str) -> None:
        self.systemctl("stop", name, check=False)
        (self.unit_dir / name).unlink(missing_ok=True)
        self.systemctl("daemon-reload")

    def show(self, unit: str, *props: str) -> dict[str, str]:
        """`systemctl --user show -p P…` as a dict."""
        out = self.systemctl("show", unit, *(f"-p{p}" for p in props)).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def __enter__(self) -> UserManager:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
