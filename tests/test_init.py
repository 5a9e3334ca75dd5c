"""`genready init`: the translation from ExecStart= to a target table, in-process (a pure function),
then the command itself on real units of the private systemd user manager (not started: init must
work on a unit that does not run), including --write on a commented config."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from genready import config
from genready.compat import tomllib
from genready.exitcodes import Exit
from genready.servers import kinds
from genready.systemd import snapshot
from genready.tools import unitinit
from genready_dev.harness import GENREADY
from genready_dev.usermanager import UserManager

SECRET = "sk-very-secret-4711"


def table(argv: list[str], env: dict[str, str] | None = None, unit: str = "srv.service") -> dict[str, Any]:
    """The rendered TOML, parsed back: what a user would paste into the config."""
    prop = unitinit.target_from_exec(unit, argv, env or {})
    text = unitinit.render("t", prop)
    parsed: dict[str, Any] = tomllib.loads(text)["targets"]["t"]
    # every table init prints is a valid target (the key files named need not exist here)
    keyless = {k: v for k, v in parsed.items() if k not in ("api_key_file", "api_key_credential")}
    config.parse({"targets": {"t": keyless}})
    # every table names its server's kind (test_init_writes_the_kind checks which); the rest is compared whole
    assert kinds.BY_NAME[parsed.pop("kind")].api == parsed["api"], parsed
    return parsed


# --- each server and each recognised flag ---------------------------------------------------------

@pytest.mark.parametrize("argv", [
    ["/opt/venv/bin/python3", "-m", "sglang.launch_server", "--model-path", "m"],
    ["/opt/venv/bin/sglang", "serve", "--model-path", "m"],
    ["/usr/bin/python3.11", "-m", "sglang", "serve", "--model-path", "m"],
])
def test_sglang_defaults(argv: list[str]) -> None:
    # python/sglang/srt/server_args.py: host "127.0.0.1", port 30000
    assert table(argv) == {"unit": "srv.service", "url": "http://127.0.0.1:30000", "api": "sglang"}


@pytest.mark.parametrize(("argv", "kind"), [
    (["/opt/venv/bin/python3", "-m", "sglang.launch_server", "--model-path", "m"], "sglang"),
    (["vllm", "serve", "m"], "vllm"),
    (["/usr/bin/llama-server", "-m", "m.gguf"], "llama.cpp"),
    (["python3", "-m", "llama_cpp.server", "--model", "m.gguf"], "llama-cpp-python"),
])
def test_init_writes_the_kind(argv: list[str], kind: str) -> None:
    # issue 49 §1: the target knows its kind from init on; a name config.py takes
    parsed = tomllib.loads(unitinit.render("t", unitinit.target_from_exec("srv.service", argv, {})))["targets"]["t"]
    assert parsed["kind"] == kind
    assert config.parse({"targets": {"t": parsed}}).targets["t"].kind == kind


def test_init_reads_a_port_from_the_units_environment() -> None:
    # issue 53 item 1: systemd expands ${PORT} and $OPTIONS when it starts the server; init reads them the same way
    argv = ["/usr/bin/python3", "-m", "sglang.launch_server", "--port", "${PORT}", "$OPTIONS"]
    assert table(argv, {"PORT": "30222", "OPTIONS": ""})["url"] == "http://127.0.0.1:30222"
    assert table([*argv[:3], "$OPTIONS"], {"OPTIONS": "--port 30333 --host 0.0.0.0"})["url"] == \
        "http://127.0.0.1:30333"
    prop = unitinit.target_from_exec("srv.service", argv, {"OPTIONS": ""})  # PORT: systemd's, or an unread file's
    assert any("uses $PORT, which genready cannot read here" in c for c in prop.comments), prop.comments


def test_sglang_flags() -> None:
    t = table(["/v/bin/python", "-m", "sglang.launch_server", "--model-path", "meta/L", "--host=0.0.0.0",
               "--port", "31000", "--served-model-name", "llama", "--ssl-keyfile", "/k", "--ssl-certfile", "/c",
               "--fastapi-root-path", "/sg"])
    assert t == {"unit": "srv.service", "url": "https://127.0.0.1:31000/sg", "api": "sglang"}


@pytest.mark.parametrize("argv,url,model", [
    (["/usr/local/bin/vllm", "serve", "Qwen/Qwen3-8B"], "http://127.0.0.1:8000", "Qwen/Qwen3-8B"),
    (["/v/bin/python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "Qwen/Q", "--port", "8001",
      "--host", "::"], "http://[::1]:8001", "Qwen/Q"),
    (["/usr/local/bin/vllm", "serve", "Q/Q", "--served-model-name", "first", "second", "--port", "9"],
     "http://127.0.0.1:9", "first"),
    (["/usr/local/bin/vllm", "serve", "Q/Q", "--uds", "/run/vllm/api.sock", "--root-path", "/v"],
     "unix:/run/vllm/api.sock", "Q/Q"),
    (["/usr/local/bin/vllm", "serve", "Q/Q", "--ssl-keyfile=/k", "--ssl-certfile=/c", "--host", "10.0.0.5"],
     "https://10.0.0.5:8000", "Q/Q"),
])
def test_vllm(argv: list[str], url: str, model: str) -> None:
    t = table(argv)
    assert (t["url"], t["api"], t["model"]) == (url, "openai-completions", model)
    assert t.get("path_prefix") == ("/v" if "--root-path" in argv else None)


def test_llama_cpp_flags_and_its_environment_variables() -> None:
    t = table(["/usr/bin/llama-server", "-m", "/m.gguf", "--host", "0.0.0.0", "--port", "8081", "-a", "tiny",
               "--api-key-file", "/etc/llama/key", "--api-prefix", "/llm"])
    assert t == {"unit": "srv.service", "url": "http://127.0.0.1:8081/llm", "api": "openai-completions",
                 "model": "tiny", "api_key_file": "/etc/llama/key"}
    # common/arg.cpp: LLAMA_ARG_HOST/PORT, and a host ending in .sock is a unix socket
    t = table(["/usr/bin/llama-server", "-m", "/m.gguf"], {"LLAMA_ARG_HOST": "/run/llama.sock",
                                                            "LLAMA_ARG_API_PREFIX": "/p"})
    assert (t["url"], t["path_prefix"]) == ("unix:/run/llama.sock", "/p")
    assert table(["/usr/bin/llama-server"], {"LLAMA_ARG_PORT": "7000"})["url"] == "http://127.0.0.1:7000"


def test_llama_cpp_python() -> None:
    t = table(["/v/bin/python3", "-m", "llama_cpp.server", "--model", "/m.gguf", "--model_alias", "a",
               "--port", "8100", "--ssl_keyfile", "/k", "--ssl_certfile", "/c"])
    assert (t["url"], t["model"]) == ("https://localhost:8100", "a")


@pytest.mark.parametrize(("argv", "url"), [
    (["/usr/local/bin/trtllm-serve", "/models/llama-3-8b", "--extra_llm_api_options", "/etc/trt.yml"],
     "http://localhost:8000"),
    (["trtllm-serve", "serve", "meta-llama/Llama-3.1-8B", "--host", "0.0.0.0", "--port", "8100", "--tp_size", "2"],
     "http://127.0.0.1:8100"),
])
def test_tensorrt_llm(argv: list[str], url: str) -> None:
    """trtllm-serve MODEL (tensorrt_llm/commands/serve.py: --host localhost, --port 8000): no model is written,
    since its /v1/models names a local model's directory, not the path (discovery finds it)."""
    t = table(argv)
    assert (t["url"], t["api"]) == (url, "openai-completions") and "model" not in t, t


def test_a_server_on_localhost_is_warned_about() -> None:
    """localhost is ::1 and 127.0.0.1: the server listens on one, any local user can take the other."""
    prop = unitinit.target_from_exec("s.service", ["/v/bin/python3", "-m", "llama_cpp.server", "--model", "/m.gguf"],
                                     {})
    assert prop.table["url"] == "http://localhost:8000"
    assert any("localhost" in w and "free for any local user to bind" in w for w in prop.warnings), prop.warnings
    prop = unitinit.target_from_exec("s.service", ["/usr/bin/llama-server", "-m", "/m.gguf"], {})
    assert not any("localhost" in w for w in prop.warnings)


@pytest.mark.parametrize(("argv", "health_route"), [
    (["/v/bin/python3", "-m", "llama_cpp.server", "--model", "/m.gguf"], False),
    (["/usr/bin/llama-server", "-m", "/m.gguf"], True),
    (["/usr/local/bin/vllm", "serve", "m"], True),
    (["/opt/venv/bin/sglang", "serve", "--model-path", "m"], True),
])
def test_health_path_stays_at_its_default_and_a_server_without_the_route_is_named(
        argv: list[str], health_route: bool) -> None:
    """llama-cpp-python's server has no /health (llama_cpp/server/app.py): the 404 says so at run
    time, so init writes no health_path for it either, and says why in a comment."""
    prop = unitinit.target_from_exec("s.service", argv, {})
    assert "health_path" not in table(argv)
    said = [c for c in prop.comments if "no health route" in c]
    assert bool(said) is not health_route, prop.comments
    if said:
        assert 'health: "absent"' in said[0] and "generation alone" in said[0]


def test_tls_says_where_ca_file_goes() -> None:
    prop = unitinit.target_from_exec("s.service", ["/usr/local/bin/vllm", "serve", "m", "--ssl-keyfile", "/k"], {})
    assert any("ca_file" in c for c in prop.comments)


def test_wrappers_shell_env_and_nice() -> None:
    argv = ["/bin/sh", "-c", "cd /srv && exec env HF_TOKEN=x /usr/bin/nice -n 5 /usr/bin/llama-server --port 1234"]
    assert table(argv)["url"] == "http://127.0.0.1:1234"


# --- containers -----------------------------------------------------------------------------------

@pytest.mark.parametrize("engine", ["docker", "podman"])
def test_container_published_port(engine: str) -> None:
    t = table([f"/usr/bin/{engine}", "run", "--rm", "-it", "--name", "vllm-a", "--gpus", "all",
               "-v", "/models:/models", "-p", "127.0.0.1:9000:8000", "vllm/vllm-openai:latest", "--model", "x/y"])
    assert t == {"unit": "srv.service", "url": "http://127.0.0.1:9000", "api": "openai-completions",
                 "model": "x/y", "owner": "container", "container": "vllm-a"}


@pytest.mark.parametrize("engine", ["docker", "podman"])
def test_container_host_network_uses_the_servers_port(engine: str) -> None:
    t = table([f"/usr/bin/{engine}", "run", "--network=host", "--name=sg", "lmsysorg/sglang:latest",
               "python3", "-m", "sglang.launch_server", "--model-path", "m", "--port", "31000"])
    assert (t["url"], t["owner"], t["container"]) == ("http://127.0.0.1:31000", "container", "sg")


def test_container_unpublished_port_and_no_name_are_said() -> None:
    prop = unitinit.target_from_exec("s.service", ["/usr/bin/docker", "run", "ghcr.io/ggml-org/llama.cpp:server",
                                                   "-m", "/m.gguf"], {})
    assert prop.table["owner"] == "container" and "container" not in prop.table
    assert any("not published" in c for c in prop.comments) and any("--name" in c for c in prop.comments)


# --- keys -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv,env", [
    (["/v/bin/python", "-m", "sglang.launch_server", "--model-path", "m", "--api-key", SECRET], {}),
    (["/usr/local/bin/vllm", "serve", "m", f"--api-key={SECRET}"], {}),
    (["/usr/local/bin/vllm", "serve", "m"], {"VLLM_API_KEY": SECRET}),
    (["/usr/bin/llama-server", "--api-key", SECRET], {}),
    (["/usr/bin/docker", "run", "--name", "v", "-e", f"VLLM_API_KEY={SECRET}", "vllm/vllm-openai", "--model", "m"],
     {}),
])
def test_a_literal_key_is_warned_about_never_printed(argv: list[str], env: dict[str, str]) -> None:
    prop = unitinit.target_from_exec("s.service", argv, env)
    assert prop.warnings and "Fix:" in prop.warnings[0]
    assert SECRET not in "".join(prop.warnings) + unitinit.render("s", prop)
    assert "api_key_file" not in prop.table  # nothing to point at yet: a comment says what to set


def test_llama_cpp_socket_says_to_remove_a_stale_one() -> None:
    prop = unitinit.target_from_exec("l.service", ["/usr/bin/llama-server", "--host", "/run/llama/api.sock"], {})
    assert prop.table["url"] == "unix:/run/llama/api.sock"
    assert any("ExecStartPre=-/bin/rm -f /run/llama/api.sock" in c for c in prop.comments), prop.comments
    vllm = unitinit.target_from_exec("v.service", ["/usr/local/bin/vllm", "serve", "m", "--uds", "/run/v.sock"], {})
    assert not any("ExecStartPre" in c for c in vllm.comments)  # uvicorn replaces a stale socket itself


def test_llama_cpp_key_file_from_its_variable() -> None:
    # common/arg.cpp: --api-key-file's variable is LLAMA_ARG_API_KEY_FILE
    t = table(["/usr/bin/llama-server"], {"LLAMA_ARG_API_KEY_FILE": "/etc/llama/key"})
    assert t["api_key_file"] == "/etc/llama/key"


def test_a_key_file_from_a_credential() -> None:
    t = table(["/usr/bin/llama-server", "--api-key-file", "${CREDENTIALS_DIRECTORY}/llama-key"])
    assert t["api_key_credential"] == "llama-key"


# --- not recognised -------------------------------------------------------------------------------

def test_unrecognised_names_what_it_found_without_keys() -> None:
    with pytest.raises(unitinit.Unrecognised) as e:
        unitinit.propose("web.service", [["/usr/bin/python3", "-m", "http.server", "--api-key", SECRET]], {})
    assert "/usr/bin/python3 -m http.server" in str(e.value) and SECRET not in str(e.value)
    tmpl = unitinit.template("web.service", "web")
    assert all(line.startswith("#") for line in tmpl.splitlines())
    body = "\n".join(line.removeprefix("# ") for line in tmpl.splitlines()[1:]).replace("PORT", "80")
    assert tomllib.loads(body)["targets"]["web"]["unit"] == "web.service"


def test_exec_argvs_take_the_path_over_argv0() -> None:
    raw = [(b"/usr/bin/llama-server", [b"llama", b"--port", b"1"], False, 0, 0, 0, 0, 0, 0, 0)]
    assert snapshot.exec_argvs(raw) == (("/usr/bin/llama-server", "--port", "1"),)
    other = [(b"/usr/bin/llama-server", [b"llama", b"--port", b"1"], False, 5, 6, 7, 8, 99, 1, 0)]
    assert snapshot.exec_fingerprint(raw) == snapshot.exec_fingerprint(other) != ""


def test_target_name_from_unit() -> None:
    assert unitinit.target_name("sglang@gpu0.service") == "sglang-gpu0"


# --- the command, on real units -------------------------------------------------------------------

def run_init(manager: UserManager, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*GENREADY, "init", *args, "--bus", "user"], capture_output=True, text=True,
                          env={**os.environ, **manager.env, **(env or {})}, timeout=60)


def test_init_reads_a_real_unit_that_is_not_running(manager: UserManager, tmp_path: Path) -> None:
    manager.install_unit("init-sg.service", f"""[Service]
Environment=HF_HOME=/srv/hf
ExecStart=/opt/sglang/bin/python3 -m sglang.launch_server --model-path meta/L --host 0.0.0.0 --port 31999 \\
    --api-key {SECRET}
""")
    try:
        done = run_init(manager, "init-sg.service", "--name", "sg")
        assert done.returncode == 0, done.stderr
        assert tomllib.loads(done.stdout)["targets"]["sg"] == {
            "unit": "init-sg.service", "url": "http://127.0.0.1:31999", "api": "sglang", "kind": "sglang"}
        assert "--api-key" in done.stderr and "Fix:" in done.stderr and SECRET not in done.stdout + done.stderr
        # --write appends to a commented config, atomically, keeping every comment, then check-config
        cfg = tmp_path / "genready.toml"
        original = '# my genready\n[daemon]\nbus = "user"  # the user manager\n\n# the first server\n' \
                   '[targets.other]\nunit = "other.service"\nurl = "http://127.0.0.1:1"\n'
        cfg.write_text(original)
        done = run_init(manager, "init-sg.service", "--name", "sg", "--write", "--config", str(cfg))
        assert done.returncode == 0, done.stderr
        text = cfg.read_text()
        assert text.startswith(original) and "[targets.sg]" in text
        assert set(config.load(cfg).targets) == {"other", "sg"}
        assert "valid" in done.stdout
        # a second --write of the same name is refused, the file untouched
        done = run_init(manager, "init-sg.service", "--name", "sg", "--write", "--config", str(cfg))
        assert done.returncode == Exit.CONFIG and "already has [targets.sg]" in done.stderr
        assert cfg.read_text() == text
    finally:
        manager.remove_unit("init-sg.service")


def test_init_reads_the_port_a_units_environment_gives(manager: UserManager, tmp_path: Path) -> None:
    # issue 53 item 1: the bus gives ExecStart= with ${PORT} unexpanded; systemd expands it from Environment=
    # (and $OPTIONS from an EnvironmentFile=) when it starts the server: init reads what the server gets
    opts = tmp_path / "sglang.env"
    opts.write_text("OPTIONS=--host 127.0.0.1 --served-model-name m\n")
    manager.install_unit("init-port.service", f"""[Service]
Environment=PORT=30222
EnvironmentFile={opts}
ExecStart=/opt/sglang/bin/python3 -m sglang.launch_server --model-path meta/L --port ${{PORT}} $OPTIONS
""")
    try:
        done = run_init(manager, "init-port.service", "--name", "p")
        assert done.returncode == 0, done.stderr
        assert tomllib.loads(done.stdout)["targets"]["p"]["url"] == "http://127.0.0.1:30222", done.stdout
        assert "not a number" not in done.stdout and "cannot read here" not in done.stdout
    finally:
        manager.remove_unit("init-port.service")


def test_init_on_an_unrecognised_unit_exits_65(manager: UserManager) -> None:
    manager.install_unit("init-web.service", "[Service]\nExecStart=/usr/bin/python3 -m http.server 8080\n")
    try:
        done = run_init(manager, "init-web")
        assert done.returncode == Exit.BAD_DATA and int(Exit.BAD_DATA) == 65
        assert "/usr/bin/python3 -m http.server 8080" in done.stderr
        assert done.stdout.startswith("#") and "[targets.init-web]" in done.stdout
    finally:
        manager.remove_unit("init-web.service")


def test_init_on_a_missing_unit(manager: UserManager) -> None:
    done = run_init(manager, "no-such-unit.service")
    assert done.returncode == Exit.USAGE and "not-found" in done.stderr


# --- --write keeps the config what it was to everyone else ---------------------------------------

HEAD = '# ours\n[daemon]\nbus = "user"\n'


def _block(name: str, port: int) -> str:
    return unitinit.render(name, unitinit.target_from_exec(
        f"{name}.service", ["/usr/bin/python3", "-m", "sglang.launch_server", "--port", str(port)], {}))


@pytest.mark.system
def test_concurrent_writes_each_keep_their_table(tmp_path: Path) -> None:
    """20 writers at once, real processes: every one that returns has its table in the file."""
    cfg = tmp_path / "genready.toml"
    cfg.write_text(HEAD)
    child = ("import sys\nfrom genready.tools import unitinit\nprint('ready', flush=True)\nsys.stdin.read(1)\n"
             "unitinit.append_table(sys.argv[1], sys.argv[2], sys.argv[3])\n")
    procs = [subprocess.Popen([sys.executable, "-c", child, str(cfg), f"t{i}", _block(f"t{i}", 31000 + i)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(20)]
    try:
        for p in procs:  # every writer imported and waiting: then all are let go at once
            assert p.stdout is not None and p.stdout.readline() == "ready\n"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("x")
            p.stdin.close()
        codes = [p.wait(60) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
            for f in (p.stdout, p.stderr):
                if f is not None:
                    f.close()
    assert codes == [0] * 20
    text = cfg.read_text()
    assert text.startswith(HEAD)
    assert set(config.load(cfg).targets) == {f"t{i}" for i in range(20)}
    assert [p.name for p in tmp_path.iterdir()] == ["genready.toml"]  # no temporary file left


def test_write_keeps_the_mode_under_a_strict_umask(tmp_path: Path) -> None:
    cfg = tmp_path / "genready.toml"
    cfg.write_text(HEAD)
    cfg.chmod(0o644)
    old = os.umask(0o077)
    try:
        unitinit.append_table(str(cfg), "a", _block("a", 31000))
        new = tmp_path / "new.toml"  # a config that did not exist: readable by the DynamicUser daemon
        unitinit.append_table(str(new), "b", _block("b", 31001))
    finally:
        os.umask(old)
    assert stat.S_IMODE(cfg.stat().st_mode) == 0o644 and "[targets.a]" in cfg.read_text()
    assert stat.S_IMODE(new.stat().st_mode) == 0o644 and set(config.load(new).targets) == {"b"}


def test_write_goes_through_a_symlink_to_its_target(tmp_path: Path) -> None:
    managed = tmp_path / "managed"
    managed.mkdir()
    target = managed / "genready.toml"
    target.write_text(HEAD)
    link = tmp_path / "genready.toml"
    link.symlink_to(target)
    unitinit.append_table(str(link), "a", _block("a", 31000))
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert set(config.load(target).targets) == {"a"}
    assert sorted(p.name for p in managed.iterdir()) == ["genready.toml"]


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another owner needs root")
def test_write_keeps_owner_and_group(tmp_path: Path) -> None:
    cfg = tmp_path / "genready.toml"
    cfg.write_text(HEAD)
    os.chown(cfg, 0, 65534)  # root:nogroup, as a package or an admin set it
    os.chmod(cfg, 0o640)
    unitinit.append_table(str(cfg), "a", _block("a", 31000))
    st = cfg.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 65534, 0o640)
    os.chown(cfg, 65534, 65534)  # someone else's file, written by root: still theirs
    unitinit.append_table(str(cfg), "b", _block("b", 31001))
    st = cfg.stat()
    assert (st.st_uid, st.st_gid) == (65534, 65534) and set(config.load(cfg).targets) == {"a", "b"}
