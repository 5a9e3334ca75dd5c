"""The fleet recipes of docs/sweeps.md, run: packaging/examples/sweep-array.sbatch under a real one-node
Slurm cluster, packaging/examples/sweep-fleet.yml under real Ansible, each over a 2 server
configurations x 2 client settings plan against the simulator unit of the private systemd manager.

The files run as they are; each test adapts them only through what they read (sbatch's `--array`,
the environment, Ansible's inventory and variables), as a site would. The docs quote the files
verbatim (checked here), so what the docs show is what ran.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import stat
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from genready_dev import fleet
from genready_dev.harness import GENREADY, PY, REPO, wait_for
from genready_dev.usermanager import UserManager
from tests import ci
from tests.test_sweep import Rig

EXAMPLES = REPO / "packaging" / "examples"
SBATCH = EXAMPLES / "sweep-array.sbatch"
PLAY = EXAMPLES / "sweep-fleet.yml"
# The genready the recipes run: the one of the interpreter running the tests (each test run's own venv,
# Debian's python3 in .venv-debian included), through the variable a site sets for its own path.
GENREADY_BIN = Path(sys.executable).parent / "genready"
# The plan's two server configurations (the simulator's accept length) in group order; c is the client's.
ACCEPTS = (2, 3)


def test_the_docs_quote_the_recipe_files_verbatim() -> None:
    """docs/sweeps.md links each file and shows it, byte for byte, in the code block right after."""
    doc = (REPO / "docs" / "sweeps.md").read_text()
    for path in (SBATCH, PLAY):
        link = f"](../packaging/examples/{path.name})"
        assert link in doc, f"docs/sweeps.md does not link {path.name}"
        m = re.compile(r"```[a-z]*\n(.*?)```", re.S).search(doc, doc.index(link))
        assert m is not None and m.group(1) == path.read_text(), f"docs/sweeps.md's copy of {path.name} differs"


def test_the_recipes_are_shipped_with_the_package() -> None:
    assert "packaging/examples/*" in (REPO / "packaging" / "debian" / "genready.examples").read_text().split()



def unpack_script() -> str:
    """The recipe's `unpack_script` (a YAML block scalar: the lines indented past its key), as the play runs it."""
    lines = PLAY.read_text().splitlines()
    lines = lines[lines.index("    unpack_script: |") + 1:]
    end = next(i for i, ln in enumerate(lines) if ln.strip() and not ln.startswith("      "))
    return "".join(ln[6:] + "\n" for ln in lines[:end])


@pytest.mark.system  # it runs the script as the play does: in a Python process of its own
def test_the_plays_unpacker_keeps_a_crafted_archive_inside_the_folder(tmp_path: Path) -> None:
    """What GNU tar on a host never writes but whoever is root there can send in its place: absolute names,
    `..`, hard links to the controller's files, a symlink then a file through it, a file over a folder.
    Nothing is written outside the host's folder, which replaces the previous one."""
    def member(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", link: str = "") -> None:
        info = tarfile.TarInfo(name)
        info.type, info.linkname, info.size, info.mode = kind, link, len(data), 0o644
        tar.addfile(info, io.BytesIO(data) if data else None)

    archive, dest = tmp_path / "gpu-a.tar.gz", tmp_path / "gpu-a"
    with tarfile.open(archive, "w:gz") as tar:
        member("./results.jsonl", data=b"{}\n")
        member("/tmp/genready-fleet-abs", data=b"x")
        member("../escaped", data=b"x")
        member("./a/../../escaped-too", data=b"x")
        member("./pw", tarfile.LNKTYPE, link="/etc/passwd")
        member("./copy", tarfile.LNKTYPE, link="./results.jsonl")  # a hard link within: a copy
        member("./x", tarfile.SYMTYPE, link="/etc")
        member("./x/cron", data=b"x")  # through the symlink, had it been made: into a folder x, here
        member("./d", tarfile.DIRTYPE)
        member("./d", data=b"x")
    dest.mkdir()
    (dest / "stale").write_text("from an earlier play\n")
    (dest / "old-link").symlink_to("/etc")
    p = subprocess.run([sys.executable, "-", str(archive), str(dest)], input=unpack_script(), capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    said = p.stdout.splitlines()
    assert said == ["'/tmp/genready-fleet-abs': a path out of the folder, left out",
                        "'../escaped': a path out of the folder, left out",
                        "'./a/../../escaped-too': a path out of the folder, left out",
                        "'pw': a hard link to no file of the folder, left out",
                        "'x': a symlink, left out",
                        "'d': left out (Is a directory)"], said
    assert sorted(q.name for q in tmp_path.iterdir()) == ["gpu-a", "gpu-a.tar.gz"]  # nothing beside it
    assert not Path("/tmp/genready-fleet-abs").exists()
    found = {str(q.relative_to(dest)): stat.filemode(q.lstat().st_mode) for q in dest.rglob("*")}
    assert found == {"results.jsonl": "-rw-r--r--", "copy": "-rw-r--r--", "x": "drwxr-xr-x",
                     "x/cron": "-rw-r--r--", "d": "drwxr-xr-x"}, found
    assert (dest / "copy").read_bytes() == b"{}\n"


# --- the rig: the simulator unit, a genready watching it, the plan ----------------------------------


@pytest.fixture
def rig(manager: UserManager, tmp_path: Path) -> Iterator[Rig]:
    if not GENREADY_BIN.exists():
        pytest.fail(f"{GENREADY_BIN} is missing: the recipes run the genready of the test's venv (pip install -e .)")
    r = Rig(manager, tmp_path)
    yield r
    r.close()


def write_plan(rig: Rig) -> Path:
    doc = {"target": "t", "timeout": 20,
           "command": [PY, "-m", "genready.benchclient", "--url", rig.url, "-n", "3", "-c", "{c}", "--max-tokens",
                       "6", "--output", "{out}/bench.jsonl"],  # 6: a whole number of steps at accept 2 and 3
           "dropin": '[Service]\nEnvironment="SIM_FLAGS=--spec-accept {accept} --token-latency 0.001"\n',
           "matrix": {"accept": list(ACCEPTS), "c": [1, 2]}}
    plan = rig.tmp / "fleet-plan.toml"
    plan.write_text(tomli_w.dumps(doc))
    return plan


def sweep_env(rig: Rig) -> dict[str, str]:
    """What the recipes' sweeps need on this "host": its genready, its config, and its manager's bus."""
    return {"GENREADY": str(GENREADY_BIN), "GENREADY_CONFIG": str(rig.g.config_path),
            "XDG_RUNTIME_DIR": rig.manager.env["XDG_RUNTIME_DIR"],
            "DBUS_SESSION_BUS_ADDRESS": rig.manager.env["DBUS_SESSION_BUS_ADDRESS"]}


def results(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in (folder / "results.jsonl").read_text().splitlines()]


def check_shards(folders: list[Path]) -> None:
    """Shard K (folder K) ran the K-th server configuration; together: every point once, one load per
    configuration, each point's own bench output; `genready sweep report` over them shows all four."""
    every: list[dict[str, Any]] = []
    for k, folder in enumerate(folders):
        lines = [{**ln, "shard": k} for ln in results(folder)]
        assert {ln["point"]["accept"] for ln in lines} == {ACCEPTS[k]}, (folder, lines)
        assert all(ln["status"] == "ok" and ln["attempt"] == 1 for ln in lines), lines
        for ln in lines:
            assert (folder / ln["out"] / "bench.jsonl").read_text().strip(), ln  # the point's command ran
        every += lines
    assert sorted(ln["index"] for ln in every) == [1, 2, 3, 4], every  # 1-based, in the plan
    # A line's `group` counts in its own shard's run order (each shard's first is 1): per shard, then.
    for g in {(ln["shard"], ln["group"]) for ln in every}:
        group = [ln for ln in every if (ln["shard"], ln["group"]) == g]
        assert [ln["restarted"] for ln in group] == [True, False], group  # one load, the second point reused it
        assert len({(ln["pid"], ln["invocation_id"]) for ln in group}) == 1, group
    assert len({ln["pid"] for ln in every}) == 2
    report = subprocess.run([*GENREADY, "sweep", "report", *map(str, folders), "--format", "json"],
                            capture_output=True, text=True, timeout=30, check=True)
    rows = json.loads(report.stdout)["rows"]
    assert [(r["point"], r["status"]) for r in rows] == [
        (f"accept={a} c={c}", "ok") for a in ACCEPTS for c in (1, 2)], rows
    assert [r["accept_length"] for r in rows] == [2.0, 2.0, 3.0, 3.0], rows


# --- Slurm ------------------------------------------------------------------------------------------


@pytest.fixture
def slurm(tmp_path: Path) -> Iterator[fleet.SlurmCluster]:
    ci.require(fleet.slurm_missing(), "the Slurm recipe's test")
    cluster = fleet.SlurmCluster(tmp_path).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.mark.system
def test_the_slurm_job_array_runs_one_shard_per_task(rig: Rig, slurm: fleet.SlurmCluster, tmp_path: Path) -> None:
    plan, root = write_plan(rig), tmp_path / "sweeps"
    # Two tasks, two shards; the script's --exclusive runs them in turn on the one node (and its one unit).
    job = slurm.sbatch("--array=0-1", str(SBATCH), str(plan), str(root), cwd=tmp_path, env=sweep_env(rig))
    wait_for(lambda: not slurm.queued(job), 120, lambda: f"job {job} done: squeue says {slurm.queued(job)}")
    # The output files, not the jobs' state: a job that failed to launch can still show COMPLETED.
    for task in (0, 1):
        out_file = tmp_path / f"genready-sweep-{job}_{task}.out"
        assert out_file.exists(), f"no {out_file.name}: {sorted(p.name for p in tmp_path.iterdir())}; " \
                                  f"slurmd.log: {(tmp_path / 'slurmd.log').read_text()[-2000:]}"
        out = out_file.read_text()
        shard = f"{task + 1}/2"
        assert f"array task {task} of job {job} on {slurm.node}: shard {shard} into {root}/shard-{task + 1}-of-2\n" \
            in out, out
        assert f"2/2 points ok (shard {shard}), 1 load" in out, out
    check_shards([root / "shard-1-of-2", root / "shard-2-of-2"])
    first, second = results(root / "shard-1-of-2"), results(root / "shard-2-of-2")
    assert first[-1]["ended_at"] < second[0]["started_at"], (first, second)  # in turn: --exclusive
    # A task run again alone (SWEEP_SHARDS: its array now has one task) is still its shard, and resumes it.
    before = (root / "shard-2-of-2" / "results.jsonl").read_bytes()
    again = slurm.sbatch("--array=1", str(SBATCH), str(plan), str(root), cwd=tmp_path,
                         env={**sweep_env(rig), "SWEEP_SHARDS": "2"})
    wait_for(lambda: not slurm.queued(again), 60, lambda: f"job {again} done: squeue says {slurm.queued(again)}")
    out = (tmp_path / f"genready-sweep-{again}_1.out").read_text()
    assert f"shard 2/2 into {root}/shard-2-of-2\n" in out and "--resume: 2 of 4 points already ok" in out, out
    assert (root / "shard-2-of-2" / "results.jsonl").read_bytes() == before
    rig.assert_restored()


# --- Ansible ----------------------------------------------------------------------------------------


def run_play(rig: Rig, tmp_path: Path, plan: Path, hosts: dict[str, Path], collect: Path,
             **variables: Any) -> subprocess.CompletedProcess[str]:
    """packaging/examples/sweep-fleet.yml against aliases of localhost, each with its own work dir."""
    ci.require(fleet.ansible_missing(), "the Ansible recipe's test")
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("[gpu]\n" + "".join(
        f"{h} ansible_connection=local sweep_results={d / 'results'}\n" for h, d in hosts.items()) +
        # else Ansible picks the first python3 on PATH (a pyenv shim here): the controller's own.
        '[gpu:vars]\nansible_python_interpreter="{{ ansible_playbook_python }}"\n')
    env = sweep_env(rig)
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps({"sweep_plan": str(plan), "sweep_collect": str(collect), "sweep_poll": 1,
                                 "genready": env.pop("GENREADY"), "genready_environment": env, **variables}))
    home = tmp_path / "ansible-home"  # nothing of Ansible's own under /root, no ansible.cfg of the host's
    (tmp_path / "ansible.cfg").write_text("[defaults]\n")
    ansible_env = {**rig.manager.env, "ANSIBLE_HOME": str(home), "ANSIBLE_LOCAL_TEMP": str(home / "tmp"),
                   "ANSIBLE_ASYNC_DIR": str(home / "async"), "ANSIBLE_NOCOLOR": "1",
                   "ANSIBLE_RETRY_FILES_ENABLED": "0", "ANSIBLE_CONFIG": str(tmp_path / "ansible.cfg")}
    # -f 1: the aliases take the one simulator unit in turn (two real hosts each have their own).
    p = subprocess.run([str(fleet.ansible_playbook()), "-i", str(inventory), "-f", "1", "-e", f"@{extra}", str(PLAY)],
                       cwd=tmp_path, env=ansible_env, capture_output=True, text=True, timeout=300)
    print(p.stdout, p.stderr)
    return p


@pytest.mark.system
def test_the_ansible_play_runs_one_shard_per_host_and_brings_the_folders_home(rig: Rig, tmp_path: Path) -> None:
    collect = tmp_path / "collected"
    hosts = {"gpu-a": tmp_path / "gpu-a", "gpu-b": tmp_path / "gpu-b"}
    p = run_play(rig, tmp_path, write_plan(rig), hosts, collect)
    assert p.returncode == 0, p.stdout + p.stderr
    for h in hosts:
        assert re.search(rf"^{h}\s+: ok=\d+\s+changed=\d+\s+unreachable=0\s+failed=0", p.stdout, re.M), p.stdout
    check_shards([collect / h for h in hosts])
    for h, d in hosts.items():  # home: the same results, and every point folder, as on the host
        assert (collect / h / "results.jsonl").read_bytes() == (d / "results" / "results.jsonl").read_bytes()
        assert sorted(p.relative_to(collect / h) for p in (collect / h).rglob("*")) == \
            sorted(p.relative_to(d / "results") for p in (d / "results").rglob("*"))
    assert sorted(p.name for p in collect.iterdir()) == sorted(hosts)  # no archive left behind
    rig.assert_restored()


@pytest.mark.system
def test_the_ansible_play_brings_a_shard_with_a_failed_point_home_and_fails(rig: Rig, tmp_path: Path) -> None:
    plan = tmp_path / "failing.toml"  # one configuration; the point c=2's command exits 1
    plan.write_text(tomli_w.dumps({"target": "t", "timeout": 20, "command": [PY, "-c", "raise SystemExit({c} - 1)"],
                                   "dropin": '[Service]\nEnvironment="SIM_FLAGS=--spec-accept 2"\n',
                                   "matrix": {"c": [1, 2]}}))
    collect = tmp_path / "collected"
    p = run_play(rig, tmp_path, plan, {"gpu-a": tmp_path / "gpu-a"}, collect)
    assert p.returncode == 2, p.stdout + p.stderr  # ansible-playbook: a host failed
    assert "genready sweep exited 1: some points were not ok" in p.stdout, p.stdout
    assert re.search(r"^gpu-a\s+: ok=\d+\s+changed=\d+\s+unreachable=0\s+failed=1", p.stdout, re.M), p.stdout
    lines = results(collect / "gpu-a")
    assert [(ln["point"], ln["status"]) for ln in lines] == [({"c": 1}, "ok"), ({"c": 2}, "failed")], lines
    rig.assert_restored()


def plant_hostile_files(folder: Path) -> dict[str, str]:
    """What a root sweep's command, or whoever is root on the host, can leave in its results folder for the
    controller to unpack: a setuid-root and a setgid executable, a file of another owner, world-writable
    folders (the folder itself: the archive's `.`), links out of the folder, a device and a FIFO. The names
    of those the play must say it left out, each with the words it gives."""
    folder.mkdir(parents=True)
    for name, mode in (("setuid-sh", 0o4755), ("setgid-sh", 0o2755)):
        (folder / name).write_bytes(Path("/bin/sh").read_bytes())
        (folder / name).chmod(mode)  # chmod after the write: the bits a write would clear
    (folder / "foreign").write_text("a file of another owner\n")
    os.chown(folder / "foreign", 4321, 4321)
    (folder / "open").mkdir()
    (folder / "open").chmod(0o1777)
    folder.chmod(0o777)
    (folder / "etc").symlink_to("/etc")
    (folder / "up").symlink_to("../../..")
    (folder / "open" / "shadow").symlink_to("/etc/shadow")
    os.mknod(folder / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))  # the test runs as root (the rig's manager)
    os.mkfifo(folder / "fifo")
    return {"setuid-sh": "setuid/setgid bits dropped", "setgid-sh": "setuid/setgid bits dropped",
            "etc": "a symlink", "up": "a symlink", "open/shadow": "a symlink", "null": "a character device",
            "fifo": "a FIFO"}


@pytest.mark.system
def test_the_ansible_play_unpacks_a_hostile_hosts_folder_as_plain_files_of_the_controllers_user(
        rig: Rig, tmp_path: Path) -> None:
    """The controller runs as root here, as with `-b`: GNU tar as root would recreate every owner, mode and
    file type the host's archive holds. Only plain files and folders come home, with plain modes, owned by
    whoever ran the play; what was left out is named, and the host's play fails saying so."""
    collect, host = tmp_path / "collected", tmp_path / "gpu-a"
    left_out = plant_hostile_files(host / "results")
    p = run_play(rig, tmp_path, write_plan(rig), {"gpu-a": host}, collect)
    home = collect / "gpu-a"
    found = {str(path.relative_to(home)): path.lstat() for path in [home, *home.rglob("*")]}
    bad = {name: (stat.filemode(st.st_mode), st.st_uid, st.st_gid) for name, st in found.items()
           if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)) or st.st_mode & 0o7022
           or (st.st_uid, st.st_gid) != (os.getuid(), os.getgid())}
    assert not bad, f"unpacked as the host had them: {bad}"
    for name, why in left_out.items():
        assert f"{name!r}: {why}" in p.stdout, p.stdout
    assert sorted(found) == sorted(name for name in
                                   [".", *(str(q.relative_to(host / "results")) for q in (host / "results").rglob("*"))]
                                   if name in (".", "setuid-sh", "setgid-sh") or name not in left_out)
    # What they held came home (the setuid executable as a plain one), and so did the sweep's results.
    assert (home / "setuid-sh").read_bytes() == Path("/bin/sh").read_bytes()
    assert stat.S_IMODE(found["setuid-sh"].st_mode) == 0o755 and stat.S_IMODE(found["foreign"].st_mode) == 0o644
    assert (home / "results.jsonl").read_bytes() == (host / "results" / "results.jsonl").read_bytes()
    assert [ln["status"] for ln in results(home)] == ["ok"] * 4
    assert p.returncode == 2, p.stdout + p.stderr  # every point ok, but not all of the folder came home
    assert re.search(r"^gpu-a\s+: ok=\d+\s+changed=\d+\s+unreachable=0\s+failed=1", p.stdout, re.M), p.stdout
    assert sorted(q.name for q in collect.iterdir()) == ["gpu-a"]  # no archive, no half-unpacked folder
    rig.assert_restored()


@pytest.mark.system
def test_the_ansible_play_stops_a_sweep_past_its_limit_cleanly_and_brings_its_folder_home(
        rig: Rig, tmp_path: Path) -> None:
    """Past sweep_max_seconds the sweep gets SIGTERM, not Ansible's SIGKILL of its process group: it stops the
    point's command (its own session, which that SIGKILL would miss) and removes its drop-in, and the play
    still fetches the host's folder, then fails saying the sweep ran out of time."""
    plan = tmp_path / "long.toml"  # one point, whose command outlives the limit
    plan.write_text(tomli_w.dumps({
        "target": "t", "timeout": 20, "dropin": '[Service]\nEnvironment="SIM_FLAGS=--spec-accept 2"\n',
        "command": [PY, "-c", "import os, sys, time; open(sys.argv[1] + '/pid', 'w').write(str(os.getpid())); "
                              "time.sleep(3600)", "{out}", "{c}"],
        "matrix": {"c": [1]}}))
    collect, host = tmp_path / "collected", tmp_path / "gpu-a"
    limit = 15  # seconds: the command has started well before (the simulator loads in 0.2 s)
    try:
        started = time.monotonic()
        p = run_play(rig, tmp_path, plan, {"gpu-a": host}, collect, sweep_max_seconds=limit, sweep_stop_seconds=60)
        took = time.monotonic() - started
        print(f"the play took {took:.1f} s with sweep_max_seconds={limit}")
        pid_files = list(host.glob("results/*/attempt-1/pid"))
        assert len(pid_files) == 1, f"the command did not start within the {limit} s: {p.stdout}"
        assert not alive(pid := int(pid_files[0].read_text())), f"the point's command (pid {pid}) outlived the sweep"
        rig.assert_restored()  # the drop-in is gone, and the unit runs its own configuration, verified
        home = collect / "gpu-a"  # and the folder came home, although the sweep did not end by itself
        assert home.is_dir(), p.stdout
        assert sorted(q.relative_to(home) for q in home.rglob("*")) == \
            sorted(q.relative_to(host / "results") for q in (host / "results").rglob("*"))
        [line] = results(home)
        assert (line["status"], line["reason"]) == ("invalidated", "the sweep was interrupted"), line
        assert p.returncode == 2, p.stdout + p.stderr
        assert f"genready sweep exited 124: it ran past sweep_max_seconds ({limit} s)" in p.stdout, p.stdout
        assert took < limit + 60, took  # before the SIGKILL sweep_stop_seconds later (exit 137): it ended on SIGTERM
    finally:
        for pid_file in host.glob("results/*/attempt-1/pid"):  # on the old recipe, the command lives on
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)


def alive(pid: int) -> bool:
    """`pid` runs (a zombie is not running: it only waits for its new parent to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False
