"""The Debian package, end to end: build it, install it with apt, run the INSTALLED genready.

`packaging/build-deb` (which installs its build dependencies and runs lintian) builds the .deb;
apt installs it with Debian's python3-* packages; /usr/bin/genready (Debian's python3 and
libraries, not this checkout's venv) verifies a simulator unit in the private systemd manager
until /ready answers 200; `man genready` and `systemd-analyze verify` check what it installed;
`apt-get purge` must leave nothing behind.

It changes the host (apt, /usr, /etc), so it runs only under CI=true (or GENREADY_TEST_DEB=1),
as root on a Debian-like system; otherwise it skips saying why. Select it alone with
`pytest -m deb`.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from genready import cli
from genready_dev.harness import REPO, Genready, free_port, sim_unit, wait_for
from genready_dev.usermanager import UserManager
from tests import ci

pytestmark = pytest.mark.deb

WANTED = ci.IN_CI or os.environ.get("GENREADY_TEST_DEB") == "1"
APT = ["apt-get", "-y", "-q", "-o", "DPkg::Lock::Timeout=300"]
# Debian's interpreter and libraries only: nothing of this checkout or its venv.
SYSTEM_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C.UTF-8", "HOME": "/root"}


def _unavailable() -> str | None:
    if not WANTED:
        return "installs a package on this host: runs under CI=true or GENREADY_TEST_DEB=1"
    if os.geteuid() != 0:
        return "needs root (apt)"
    for tool in ("apt-get", "dpkg", "systemd-analyze"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


@pytest.fixture(scope="module")
def deb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The package built from this checkout; if it stays installed, it is purged at the end."""
    ci.require(_unavailable(), "the package test")
    # One run at a time per host: another session's run would install or purge under this one.
    lock = open("/run/lock/genready-test-deb.lock", "w")  # noqa: SIM115 (held for the module)
    fcntl.flock(lock, fcntl.LOCK_EX)
    out = tmp_path_factory.mktemp("deb")
    started = time.monotonic()
    proc = subprocess.run([str(REPO / "packaging" / "build-deb"), str(out)], capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, f"build-deb failed:\n{proc.stdout}\n{proc.stderr}"
    print(f"build-deb (with lintian): {time.monotonic() - started:.1f}s")
    debs = list(out.glob("genready_*_all.deb"))
    assert len(debs) == 1, debs
    try:
        yield debs[0]
    finally:
        if _installed():
            subprocess.run([*APT, "purge", "genready"], capture_output=True, timeout=300)
        lock.close()


def _installed() -> bool:
    proc = subprocess.run(["dpkg-query", "-W", "-f=${Status}", "genready"], capture_output=True, text=True)
    return proc.returncode == 0 and "ok installed" in proc.stdout


def _system(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(args, capture_output=True, text=True, env=SYSTEM_ENV, cwd="/", timeout=timeout)
    if check:
        assert proc.returncode == 0, f"{' '.join(args)}: {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


class InstalledGenready(Genready):
    """`/usr/bin/genready serve` from the package, in Debian's environment, against the test
    manager's bus (its config points state_dir and runtime_dir into tmp)."""

    def start(self) -> InstalledGenready:
        env = {**SYSTEM_ENV, **{k: self.um.env[k] for k in ("XDG_RUNTIME_DIR", "DBUS_SESSION_BUS_ADDRESS")}}
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(["/usr/bin/genready", "serve", "--config", str(self.config_path)],
                                         env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL, cwd="/")
        try:
            wait_for(lambda: self.get("/status")[0] == 200 or self._dead(), 20, "the installed genready's /status")
            assert self.proc.poll() is None, f"genready exited: {self.log()}"
        except BaseException:
            self.stop()
            raise
        return self


def test_package_installs_verifies_a_unit_and_purges_clean(deb: Path, manager: UserManager, tmp_path: Path) -> None:
    started = time.monotonic()
    _system(*APT, "install", str(deb), timeout=600)
    assert _installed()
    files = [Path(p) for p in _system("dpkg-query", "-L", "genready").stdout.split()]

    # What the package put where.
    for path in ("/usr/bin/genready", "/lib/systemd/system/genready.service", "/etc/genready/genready.toml",
                 "/usr/share/doc/genready/examples/sglang.service", "/usr/share/man/man1/genready.1.gz"):
        assert Path(path) in files, path
    assert not [p for p in files if "genready_dev" in str(p)], "dev tooling shipped in the product package"
    web = {p.name for p in files if p.parent.name == "web" and p.suffix in (".css", ".js")}
    assert web == {"base.css", "status.css", "report.css", "words.js", "status.js"}, web
    conffiles = _system("dpkg-query", "-W", "-f=${Conffiles}", "genready").stdout
    assert "/etc/genready/genready.toml" in conffiles
    assert Path("/etc/systemd/system/multi-user.target.wants/genready.service").is_symlink()  # enabled
    shebang = Path("/usr/bin/genready").read_text().splitlines()[0]
    assert shebang.replace(" ", "") == "#!/usr/bin/python3", shebang
    sim = _system("/usr/bin/genready", "simulate", check=False)  # the package ships no dev tooling
    assert sim.returncode == 2 and "development tooling" in sim.stderr, sim.stderr
    where = _system("/usr/bin/python3", "-c", "import genready, aiohttp; print(genready.__file__, aiohttp.__version__)")
    assert where.stdout.startswith("/usr/lib/python3/dist-packages/genready/"), where.stdout

    # The installed program, on Debian's python and libraries, verifies a simulator unit.
    sim_port = free_port()
    manager.install_unit("deb-sim.service", sim_unit(sim_port, "--load-seconds", "0.5"))
    try:
        manager.systemctl("start", "deb-sim.service")
        target = {"unit": "deb-sim.service", "url": f"http://127.0.0.1:{sim_port}", "backoff_max": 0.5}
        with InstalledGenready(manager, tmp_path, {"sim": target}) as g:
            assert g.proc is not None
            exe = os.readlink(f"/proc/{g.proc.pid}/exe")
            assert exe.startswith("/usr/bin/python3"), exe
            ready_pid = wait_for(lambda: g.ready_pid("sim"), 60, "the installed genready's /ready/sim = 200")
            assert ready_pid == int(manager.show("deb-sim.service", "MainPID")["MainPID"])
            # the page at / is drawn from the package's data files (web/*.css, *.js), which the .deb ships
            code, page = g.get("/")
            assert code == 200 and isinstance(page, str) and "stale since" in page and "--ink:" in page, page[:300]
            maps = Path(f"/proc/{g.proc.pid}/maps").read_text()
            assert "/usr/lib/python3/dist-packages/aiohttp/" in maps  # Debian's compiled aiohttp
    finally:
        manager.remove_unit("deb-sim.service")

    # man genready: the page generated from the parser names every subcommand.
    if shutil.which("man") is None:
        _system(*APT, "install", "--no-install-recommends", "man-db", timeout=600)
    # The installed file itself (-l): `man genready` may show a formatted copy that man-db cached
    # under /var/cache/man from an earlier install, since the page's mtime is the changelog's date.
    page = _system("man", "-l", "/usr/share/man/man1/genready.1.gz").stdout
    commands = next(a for a in cli.build_parser()._actions if a.dest == "command").choices
    assert commands, "no subcommands found in the parser"
    for name in commands:
        assert name in page, f"`man genready` does not mention {name}"
    assert "/etc/genready/genready.toml" in page and "EXIT STATUS" in page

    # The installed units, as shipped (they name /usr/bin/genready, which now exists).
    verify = _system("systemd-analyze", "verify", "/lib/systemd/system/genready.service",
                     "/lib/systemd/system/genready-bench@sglang.path", check=False)
    complaints = [line for line in (verify.stdout + verify.stderr).splitlines() if "genready" in line]
    assert verify.returncode == 0 and not complaints, verify.stdout + verify.stderr

    # Purge: systemd would have made the state directory (DynamicUser=: under private/).
    Path("/var/lib/private").mkdir(mode=0o700, exist_ok=True)
    Path("/var/lib/private/genready").mkdir(exist_ok=True)
    (Path("/var/lib/private/genready") / "records.jsonl").write_text("{}\n")
    if not Path("/var/lib/genready").exists():
        Path("/var/lib/genready").symlink_to("private/genready")
    _system(*APT, "purge", "genready", timeout=600)
    assert not _installed()
    left = [p for p in files if p.exists() and not p.is_dir()]
    left += [Path(p) for p in ("/etc/genready", "/var/lib/genready", "/var/lib/private/genready",
                               "/etc/systemd/system/multi-user.target.wants/genready.service")
             if os.path.lexists(p)]
    assert not left, f"left behind after purge: {left}"
    print(f"install, verify, man, systemd-analyze, purge: {time.monotonic() - started:.1f}s")
