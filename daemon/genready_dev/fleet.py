"""The fleet tools the recipe tests run (packaging/examples/): Ansible and a one-node Slurm cluster.

Ansible (ansible-core, pinned) lives in a venv of its own in the real-servers cache
(`realservers.cache_dir()`), made by `./dev` with `python -m genready_dev.fleet ansible`: every test
run (the .venv, Python 3.10 and 3.13, Debian's own libraries) uses the same one, and none of them
gains Ansible's dependencies. `SlurmCluster` is Debian's slurm-wlm 22.05 and munge as a one-node
cluster in a folder of its own (facts: ../shared/README.md): munged on a private socket with its
own key, slurmctld and slurmd in the foreground on free ports, `SlurmUser=root`, the plugins that
need no cgroup or systemd (`proctrack/linuxproc`, `task/none`), no accounting.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from genready_dev.harness import free_port, wait_for
from genready_dev.realservers import cache_dir, make_venv  # the cache's one way to make a venv

# 2.19 is the newest ansible-core whose controller runs on Debian 12's python3 (3.11; 2.20 needs 3.12).
ANSIBLE_CORE = "2.19.14"


def ansible_venv() -> Path:
    return cache_dir() / f"ansible-core-{ANSIBLE_CORE}"


def ansible_playbook() -> Path:
    return ansible_venv() / "bin" / "ansible-playbook"


def ansible_missing() -> str | None:
    """Why Ansible cannot be used here, or None."""
    done = ansible_venv() / ".installed"
    if done.exists() and ansible_playbook().exists():
        return None
    return f"ansible-core is not installed ({done} is missing): `./dev test` installs it"


def ensure_ansible() -> Path:
    make_venv(ansible_venv(), f"ansible-core=={ANSIBLE_CORE}")
    return ansible_playbook()


SLURM_PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue")


def slurm_missing() -> str | None:
    """Why the Slurm cluster cannot run here, or None."""
    gone = [p for p in SLURM_PROGRAMS if shutil.which(p, path=os.environ.get("PATH", "") + ":/usr/sbin") is None]
    if gone:
        return f"{', '.join(gone)} not found (apt: slurm-wlm munge; `./dev test` installs them)"
    if os.geteuid() != 0:
        return "the one-node cluster runs slurmd as root (SlurmUser=root), and this is not root"
    return None


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the test process dies, so a killed test run (SIGKILL,
    where no fixture cleans up) leaves no cluster daemons behind. (The daemons run in the foreground,
    -D/-F, so the process this reaches is the daemon itself.)"""
    PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class SlurmCluster:
    """munged, slurmctld and slurmd for one node (this host), configured and kept under `root`.

    `stop()` ends all three (SIGTERM, then SIGKILL) whatever state they are in; a daemon that exits
    during `start()` fails it with its own last log lines.
    """

    def __init__(self, root: Path) -> None:
        # munged wants every folder on its socket's path searchable by all (pytest's tmp_path is 0700),
        # so the cluster gets a folder of its own under /tmp, removed by stop().
        self.root = Path(tempfile.mkdtemp(prefix="genready-slurm-", dir="/tmp"))
        self.root.chmod(0o755)
        self.logs = root  # the daemons' logs stay with the test's files
        self.node = socket.gethostname().split(".")[0]
        self.conf = self.root / "slurm.conf"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def env(self) -> dict[str, str]:
        """For sbatch, squeue and the daemons: this cluster's slurm.conf."""
        return {"SLURM_CONF": str(self.conf)}

    def _write_config(self) -> None:
        munge = self.root / "munge"
        munge.mkdir(mode=0o755)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))  # this cluster's own key: no /etc/munge, no other munged
        key.chmod(0o600)
        state, spool = self.root / "state", self.root / "spool"
        state.mkdir()
        spool.mkdir()
        self.munge_socket = munge / "munge.socket"
        self.conf.write_text(f"""\
ClusterName=genready-test
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
CredType=cred/munge
StateSaveLocation={state}
SlurmdSpoolDir={spool}
SlurmctldPidFile={self.root / "slurmctld.pid"}
SlurmdPidFile={self.root / "slurmd.pid"}
SlurmctldLogFile={self.logs / "slurmctld.log"}
SlurmdLogFile={self.logs / "slurmd.log"}
# No cgroups, no systemd as PID 1: with the default cgroup plugins jobs fail to launch (yet show
# COMPLETED) and the node drains.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")

    def _spawn(self, name: str, argv: list[str]) -> None:
        with (self.logs / f"{name}.out").open("ab") as out:
            self.procs[name] = subprocess.Popen(argv, stdout=out, stderr=out, stdin=subprocess.DEVNULL,
                                                env={**os.environ, **self.env}, preexec_fn=_die_with_parent)

    def _died(self) -> str | None:
        for name, p in self.procs.items():
            if p.poll() is not None:
                tail = (self.logs / f"{name}.out").read_text(errors="replace").splitlines()[-15:]
                return f"{name} exited {p.returncode}:\n" + "\n".join(tail)
        return None

    def start(self) -> SlurmCluster:
        try:
            self._write_config()
            m = self.munge_socket.parent
            self._spawn("munged", ["munged", "-F", f"--socket={self.munge_socket}", f"--key-file={m / 'munge.key'}",
                                   f"--pid-file={m / 'munged.pid'}", f"--seed-file={m / 'munged.seed'}",
                                   f"--log-file={self.logs / 'munged.log'}"])
            wait_for(lambda: self.munge_socket.exists() or self._died(), 10, "munged's socket")
            self._spawn("slurmctld", ["slurmctld", "-D"])
            self._spawn("slurmd", ["slurmd", "-D", "-N", self.node])
            wait_for(lambda: self._idle() or self._died(), 30, lambda: f"node {self.node} idle in sinfo")
            if reason := self._died():
                raise RuntimeError(f"the one-node Slurm cluster did not start: {reason}")
        except BaseException:
            self.stop()
            raise
        return self

    def _idle(self) -> bool:
        p = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], capture_output=True, text=True, timeout=10,
                           env={**os.environ, **self.env})
        return p.returncode == 0 and p.stdout.strip() == "idle"

    def sbatch(self, *args: str, cwd: Path, env: dict[str, str]) -> int:
        """Submit; the job's id (its environment: `env`, this cluster's SLURM_CONF, and the rest of ours)."""
        p = subprocess.run(["sbatch", "--parsable", *args], cwd=cwd, capture_output=True, text=True, timeout=30,
                           env={**os.environ, **env, **self.env})
        if p.returncode != 0:
            raise RuntimeError(f"sbatch {' '.join(args)} exited {p.returncode}: {p.stderr.strip()}")
        return int(p.stdout.strip().split(";")[0])

    def queued(self, job: int) -> list[str]:
        """The job's tasks still pending or running (squeue's own words: id and state)."""
        p = subprocess.run(["squeue", "-h", "-r", "-j", str(job), "-o", "%i %T"], capture_output=True, text=True,
                           timeout=10, env={**os.environ, **self.env})
        return p.stdout.split("\n")[:-1] if p.returncode == 0 else [f"squeue exited {p.returncode}: {p.stderr}"]

    def _any_job(self) -> bool:
        p = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, timeout=10,
                           env={**os.environ, **self.env})
        return p.returncode == 0 and bool(p.stdout.strip())

    def stop(self) -> None:
        if (ctld := self.procs.get("slurmctld")) is not None and ctld.poll() is None:
            # A job still running (a failed test) would outlive slurmd in its slurmstepd.
            subprocess.run(["scancel", "--full", f"--user={os.getuid()}"], capture_output=True, timeout=10,
                           env={**os.environ, **self.env})
            # The daemons are stopped all the same: a test that leaves a job running has failed already.
            with contextlib.suppress(AssertionError):
                wait_for(lambda: not self._any_job(), 15, "every job of the test cluster gone")
        for name in ("slurmd", "slurmctld", "munged"):  # the clients of munged first
            p = self.procs.get(name)
            if p is None or p.poll() is not None:
                continue
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        shutil.rmtree(self.root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m genready_dev.fleet",
                                description="install the fleet recipe tests' tools")
    p.add_argument("what", choices=["ansible"])
    p.parse_args(argv)
    print(ensure_ansible())
    return 0


if __name__ == "__main__":
    sys.exit(main())
