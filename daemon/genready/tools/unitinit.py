"""`genready init UNIT`: a `[targets.NAME]` table from what the unit runs.

`target_from_exec` is the whole translation, a pure function from one ExecStart= argv and the
unit's environment to a table: tests call it directly. How each server is recognised, the flags it
reads and their defaults are its ServerKind's (servers/kinds.py), each from the server's own source.
llama-cpp-python has no health route: its 404 tells the probe so, and health_path stays at its
default.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from genready import config
from genready.apis import APIS
from genready.redact import escape, redact
from genready.servers import kinds
from genready.servers.argv import read_argv
from genready.servers.kinds import ServerKind
from genready.systemd.unitexec import expand

NAME_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")



_SHELLS: Final = frozenset({"sh", "bash", "dash", "zsh"})
_ENGINES: Final = frozenset({"docker", "podman"})
# `docker run` / `podman run` options that take no value (every other option takes one).
_ENGINE_BOOL: Final = frozenset({
    "--rm", "-d", "--detach", "-i", "--interactive", "-t", "--tty", "--privileged", "--init", "--read-only",
    "-P", "--publish-all", "--replace", "--no-healthcheck", "--oom-kill-disable", "--sig-proxy", "-q", "--quiet",
    "--help", "--no-hosts", "--rmi", "--tls-verify", "--http-proxy", "--read-only-tmpfs", "--use-image-hosts",
})

class Unrecognised(Exception):
    """No server of a known kind (servers/kinds.py) in the command line; the text says what was found."""


@dataclass
class Proposal:
    """A target table, and what to tell the person who asked."""

    server: str
    table: dict[str, Any]
    comments: list[str] = field(default_factory=list)  # printed above the table, as # lines
    warnings: list[str] = field(default_factory=list)  # printed on stderr


@dataclass
class _Container:
    engine: str
    name: str
    network_host: bool
    publish: list[tuple[str, int, int]]  # (host ip or "", host port, container port)
    env: dict[str, str]


def target_name(unit: str) -> str:
    """A target name from a unit name: `sglang@gpu0.service` -> `sglang-gpu0`."""
    base = unit.removesuffix(".service")
    return NAME_CHARS.sub("-", base).strip("-.")[:64] or "server"


def shown(argv: Sequence[str]) -> str:
    """A command line for a message: quoted as a shell would, keys masked (redact's rules), control
    characters escaped, cut short."""
    text = escape(redact(shlex.join(argv)))
    return text if len(text) <= 300 else text[:300] + "…"


def target_from_exec(unit: str, argv: Sequence[str], env: Mapping[str, str],
                     env_files: Mapping[str, str] | None = None) -> Proposal:
    """The target table for a unit whose ExecStart= is `argv` with Environment= `env`; `env_files`:
    the variables of `env` that came from an EnvironmentFile=, and its path.

    Raises Unrecognised when the command is none of the servers genready knows.
    """
    unit_env = dict(env)
    # systemd expands $VARS when it starts the command: the server gets their values (--port ${PORT})
    argv, unknown = expand(argv, env)
    argv, env = _unwrap(argv, dict(env))
    container: _Container | None = None
    if argv and os.path.basename(argv[0]) in _ENGINES:
        container, argv = _engine_run(argv)
        env = {**env, **container.env}
    found = _recognise(argv)
    if found is None:
        raise Unrecognised(f"{unit} runs {shown(argv) or 'nothing'}: none of {kinds.known_words()} in it"
                           + (f", inside {container.engine} run" if container else ""))
    server, args = found
    values, positional = _flags(server, args)
    for var, what in server.env.items():
        if var in env and what not in values:
            values[what] = (env[var], f"${var}")
    prop = Proposal(server.label, {"unit": unit})
    if unknown := tuple(v for v in unknown if v != "CREDENTIALS_DIRECTORY"):  # that one: _key's api_key_credential
        prop.comments.append(f"ExecStart= uses ${', $'.join(unknown)}, which genready cannot read here (set by "
                             "systemd itself, or by an EnvironmentFile= it could not read): check the values "
                             "that come from it")
    _url(server, values, container, prop)
    prop.table["api"] = server.api
    prop.table["kind"] = server.name
    # vLLM's /v1/models names the weights when no --served-model-name is given (its `serve MODEL`
    # positional or --model); the others report a name genready can discover itself.
    model = values.get("model", ("", ""))[0]
    if server.model_is_weights and not model:
        model = values.get("weights", ("", ""))[0] or positional
    if APIS[server.api].needs_model and model:  # SGLang's own API takes no model name
        prop.table["model"] = model
    _key(server, values, prop, unit, container is not None, _exposure(values, unit_env, env, env_files or {}))
    if not server.health_route:
        # health_path stays at its default: a 404 from it is "no health route", not a refusal, so
        # the same table keeps working if a later version adds one.
        prop.comments.append(f"{server.label}'s server has no health route: its GET /health answers 404, and "
                             "readiness rests on the generation alone (/status says health: \"absent\")")
    if container is not None:
        prop.table["owner"] = "container"
        if container.name:
            prop.table["container"] = container.name
        else:
            prop.comments.append(f"no --name on the {container.engine} run line: genready finds the container "
                                 "by name; give it one (--name) and set container = \"NAME\"")
    return prop


def _unwrap(argv: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """Look through `sh -c '…'`, `env K=V cmd`, `exec cmd` and `nice`-like prefixes to the command."""
    for _ in range(8):  # a bound on wrappers of wrappers
        if not argv:
            break
        base = os.path.basename(argv[0])
        if base in _SHELLS and "-c" in argv[1:]:
            script = argv[argv.index("-c") + 1] if argv.index("-c") + 1 < len(argv) else ""
            try:
                words = shlex.split(script, comments=True)
            except ValueError:
                break
            # The last command of the script is the one that runs the server (`cd x && exec y`).
            for sep in ("&&", ";", "||"):
                if sep in words:
                    words = words[len(words) - words[::-1].index(sep):]
            argv = words
        elif base == "env":
            argv = argv[1:]
            while argv and (argv[0].startswith("-") or "=" in argv[0]):
                k, eq, v = argv.pop(0).partition("=")
                if eq and not k.startswith("-"):
                    env[k] = v
        elif base in ("exec", "nice", "ionice", "taskset", "numactl", "stdbuf", "chrt", "setsid") and len(argv) > 1:
            argv = argv[1:]
            while argv and argv[0].startswith("-"):
                argv = argv[1:]
            if base in ("taskset", "chrt", "nice") and argv and re.fullmatch(r"[0-9a-fA-Fx,.-]+", argv[0]):
                argv = argv[1:]  # their positional mask or priority
        elif argv and "=" in argv[0] and not argv[0].startswith(("-", "/")):
            k, _, v = argv.pop(0).partition("=")  # VAR=value cmd, from sh -c
            env[k] = v
        else:
            break
    return argv, env


def _engine_run(argv: list[str]) -> tuple[_Container, list[str]]:
    """Split `docker run [OPTIONS] IMAGE [CMD…]` into the container's settings and CMD."""
    engine = os.path.basename(argv[0])
    i = 1
    while i < len(argv) and argv[i].startswith("-"):  # global options (--log-level x, …)
        i += 1 if "=" in argv[i] or argv[i] in _ENGINE_BOOL else 2
    if argv[i:i + 2] == ["container", "run"]:
        i += 1
    if i >= len(argv) or argv[i] != "run":
        raise Unrecognised(f"{engine} {shown(argv[1:])}: not `{engine} run …`")
    i += 1
    c = _Container(engine, "", False, [], {})
    entrypoint: list[str] = []
    while i < len(argv) and argv[i].startswith("-"):
        opt, eq, val = argv[i].partition("=")
        if not eq and (opt in _ENGINE_BOOL or (not opt.startswith("--") and len(opt) > 2
                                               and all(f"-{ch}" in _ENGINE_BOOL for ch in opt[1:]))):
            i += 1
            continue
        if not eq:
            val = argv[i + 1] if i + 1 < len(argv) else ""
            i += 2
        else:
            i += 1
        if opt == "--name":
            c.name = val
        elif opt in ("--network", "--net"):
            c.network_host = val == "host"
        elif opt in ("-p", "--publish"):
            # [IP:][HOST_PORT:]CONTAINER_PORT[/tcp]; no HOST_PORT: the engine picks one at random
            if m := re.fullmatch(r"(?:(?:(\[[0-9a-fA-F:.]+\]|[0-9.]*):)?(\d*):)?(\d+)(?:/tcp)?", val):
                ip = (m.group(1) or "").strip("[]")
                c.publish.append((ip, int(m.group(2) or 0), int(m.group(3))))
        elif opt in ("-e", "--env"):
            k, eq2, v = val.partition("=")
            if eq2:
                c.env[k] = v
        elif opt == "--entrypoint":
            entrypoint = shlex.split(val)
    image = argv[i] if i < len(argv) else ""
    cmd = argv[i + 1:]
    if entrypoint:
        cmd = [*entrypoint, *cmd]
    elif not cmd or cmd[0].startswith("-"):
        cmd = [*kinds.image_entrypoint(image), *cmd]
    return c, cmd


def _recognise(argv: list[str]) -> tuple[ServerKind, list[str]] | None:
    """(the server, its arguments after the program) or None."""
    if not argv:
        return None
    return kinds.by_command(argv, os.path.basename(argv[0]))


def _flags(server: ServerKind, args: list[str]) -> tuple[dict[str, tuple[str, str]], str]:
    """What the arguments set: {what: (value, the flag that set it)}, and the positional argument of a kind whose
    /v1/models names its weights (vLLM's `serve MODEL`), read by the engine confirm's reader (servers/argv.py)."""
    found = read_argv(args, server.flags, positional=server.model_is_weights)
    values: dict[str, tuple[str, str]] = {}
    for flag, val in found.given:
        what = server.flags[flag]
        if what == "tls":  # either file says it is served over TLS
            values.setdefault("tls", (val, flag))
        else:
            values[what] = (val, flag)
    return values, found.positional


def _loopback(host: str | None) -> str:
    if host in (None, "", "0.0.0.0"):
        return "127.0.0.1"
    if host in ("::", "[::]"):
        return "::1"
    return host.strip("[]")


def _url(server: ServerKind, values: dict[str, tuple[str, str]], container: _Container | None, prop: Proposal) -> None:
    host = values["host"][0] if "host" in values else server.host
    prefix = values.get("prefix", ("", ""))[0].rstrip("/")
    if prefix and not prefix.startswith("/"):
        prefix = "/" + prefix
    uds = values["uds"][0] if "uds" in values else (host if host and host.endswith(".sock") else "")
    if uds:
        prop.table["url"] = f"unix:{uds}"
        if prefix:
            prop.table["path_prefix"] = prefix
        if container is not None:
            prop.comments.append(f"the socket {uds} is inside the container: mount it onto the host (-v) and "
                                 "put the host's path in url")
        elif "uds" in server.init_notes:
            prop.comments.append(server.init_notes["uds"].format(uds=uds))
        return
    try:
        port = int(values["port"][0]) if "port" in values else server.port
    except ValueError:
        port = server.port
        prop.comments.append(f"{values['port'][1]} {values['port'][0]!r} is not a number; check the port")
    scheme = "https" if "tls" in values else "http"
    if container is not None and not container.network_host:
        published = [p for p in container.publish if p[2] == port]
        if published:
            ip, host_port, _ = published[0]
            host, port = ip or None, host_port or port
            if not host_port:
                prop.comments.append(f"-p gives the container's port {port} a random host port: publish it at "
                                     "a fixed one (-p HOST:CONTAINER) and put that in url")
        else:
            prop.comments.append(f"the server's port {port} is not published (-p) and the network is not host: "
                                 "genready cannot reach it from the host")
            host = None
    h = _loopback(host)
    if h != (host or "") and host not in (None, ""):
        prop.comments.append(f"the server listens on {host}; genready asks it on loopback")
    prop.table["url"] = f"{scheme}://{f'[{h}]' if ':' in h else h}:{port}{prefix}"
    if h == "localhost":
        prop.warnings.append(f"the server listens on localhost: {config.LOCALHOST_WARNING}")
    if scheme == "https":
        prop.comments.append(f"{values['tls'][1]}: if the server's certificate is not signed by a CA this machine "
                             "trusts, set ca_file = \"/path/to/ca.pem\" (the CA that signed it)")


def _exposure(values: dict[str, tuple[str, str]], unit_env: Mapping[str, str], env: Mapping[str, str],
              env_files: Mapping[str, str]) -> str:
    """Where every local user can read the server's key, or "" where they cannot (a file only its owner
    reads). From the flag or variable that set it: a flag, `env K=V`, `docker run -e` are on the command
    line; Environment= is printed by `systemctl show`; an EnvironmentFile= is as readable as the file."""
    if "key" not in values:
        return ""
    how = values["key"][1]
    var = how[1:] if how.startswith("$") else ""
    if not var or var not in unit_env or unit_env[var] != env.get(var):
        return "on the command line, which every local user can read in /proc/PID/cmdline"
    if var not in env_files:
        return "in the unit's environment, which `systemctl show` prints to every local user"
    path = env_files[var]
    try:
        st = os.stat(path)
    except OSError:
        return ""  # not readable here either: not to every local user
    if st.st_mode & 0o004:
        return f"in EnvironmentFile={path}, which every local user can read (mode {st.st_mode & 0o7777:04o})"
    return ""


def _key(server: ServerKind, values: dict[str, tuple[str, str]], prop: Proposal, unit: str, container: bool,
         where: str = "") -> None:
    if "key_file" in values:
        path = values["key_file"][0]
        if "${CREDENTIALS_DIRECTORY}" in path or "$CREDENTIALS_DIRECTORY" in path:
            name = os.path.basename(path)
            prop.table["api_key_credential"] = name
            prop.comments.append(f"the server reads its key from the credential {name}: give genready.service "
                                 f"the same LoadCredential={name}:… line")
        else:
            prop.table["api_key_file"] = path
            prop.comments.append("genready wants one key line in api_key_file (# comment lines aside); llama.cpp "
                                 "accepts several: keep the one genready sends first, or give genready a file "
                                 "of its own")
        return
    if "key" not in values:
        return
    how = values["key"][1]
    prop.comments.append("the server wants an API key: set api_key_file = \"/path/to/key\" (a file holding it, "
                         "readable by genready) or api_key_credential")
    if not where:  # kept where only its owner reads it: nothing to fix
        return
    in_container = (" In a container, pass variables with `--env-file FILE` (a file only root reads), not -e."
                    if container else "")
    prop.warnings.append(f"{unit} gives the server its API key {where} ({how}; the key is not shown here). "
                         f"Fix: {server.key_fix}.{in_container} genready reads the key from a file holding only "
                         "the key: api_key_file (or api_key_credential)")


def template(unit: str, name: str) -> str:
    """A commented table to fill in, for a server `init` does not recognise (names through tomli-w)."""
    import tomli_w

    head, unit_line = tomli_w.dumps({"targets": {name: {}}}).strip(), tomli_w.dumps({"unit": unit}).strip()
    lines = [escape(head), escape(unit_line), 'url = "http://127.0.0.1:PORT"  # the server\'s address',
             'api = "openai-completions"  # "sglang" | "openai-completions" | "openai-chat"',
             'model = ""  # empty: the first of /v1/models', 'api_key_file = ""  # a file holding the API key, if any']
    return "# fill in and remove the leading '# ':\n" + "".join(f"# {line}\n" for line in lines)


def render(name: str, prop: Proposal) -> str:
    """The table as TOML (tomli-w), with the comments above it."""
    import tomli_w

    # Values go through tomli-w; a comment quotes ExecStart= words, in which systemd's C escapes can put
    # a line break: escaped (redact.escape), each comment stays one line.
    head = f"# {escape(prop.table['unit'])}: {prop.server}, read from its ExecStart= by `genready init`\n"
    head += "".join(f"# {escape(c)}\n" for c in prop.comments)
    return head + tomli_w.dumps({"targets": {name: prop.table}})


def propose(unit: str, commands: Sequence[Sequence[str]], env: Mapping[str, str],
            env_files: Mapping[str, str] | None = None) -> Proposal:
    """The first ExecStart= line that is a known server (a unit may have several); else Unrecognised."""
    if not commands:
        raise Unrecognised(f"{unit} has no ExecStart=")
    error: Unrecognised | None = None
    for argv in commands:
        try:
            return target_from_exec(unit, argv, env, env_files)
        except Unrecognised as e:
            error = e
    assert error is not None
    raise error


class WriteRefused(Exception):
    """--write would not give a valid config; nothing was written (the text says why)."""


def append_table(path: str, name: str, block: str) -> None:
    """Append `block` ([targets.NAME]) to the config at `path`, keeping every byte already there
    (comments included), atomically (store/durable.py). The result is validated first; a config
    that would not load is never written.

    The file stays what it was to everyone else: a symlink is written through, to its target
    (a managed file keeps being the one the link names); mode, owner and group are kept (a new
    file is 0644: the DynamicUser daemon reads it, whatever the umask). Writers are serialised by
    a lock on the config's directory (the file itself is replaced, so its inode cannot carry the
    lock), taken before the file is read: every --write that returns has its table in the file."""
    import fcntl

    from genready import config
    from genready.compat import tomllib
    from genready.store import bounded, durable

    real = os.path.realpath(path)
    try:
        lock = os.open(os.path.dirname(real), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise WriteRefused(f"cannot write {path}: {e.strerror or e}") from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            # Bounded and regular only: a FIFO named as the config must not hang init, /dev/zero not fill memory.
            old = bounded.read_file(real, config.MAX_CONFIG_BYTES).decode("utf-8")
            st = os.stat(real)
            mode, owner = st.st_mode & 0o7777, (st.st_uid, st.st_gid)
        except FileNotFoundError:
            old, mode, owner = "", 0o644, None
        except bounded.FileError as e:
            raise WriteRefused(f"{path}: {e.problem}") from None
        except (OSError, UnicodeDecodeError) as e:
            raise WriteRefused(f"{path}: cannot read it: {e}") from None
        try:
            existing = tomllib.loads(old).get("targets", {}) if old else {}
        except ValueError as e:
            raise WriteRefused(f"{path} is not valid TOML now ({e}); fix it first") from None
        if name in existing:
            raise WriteRefused(f"{path} already has [targets.{name}]; choose another name with --name")
        new = old + ("\n" if old and not old.endswith("\n") else "") + ("\n" if old else "") + block
        try:
            config.parse(tomllib.loads(new), path, service=False)  # a credential: what can be checked here
        except config.ConfigError as e:
            raise WriteRefused(f"with the new table the config would not load: {e}") from None
        try:
            durable.replace(real, new.encode("utf-8"), mode=mode,
                            owner=owner if owner is not None and owner != (os.geteuid(), os.getegid()) else None)
        except PermissionError as e:
            if owner is not None:
                raise WriteRefused(f"cannot write {path} keeping its owner and group "
                                   f"({owner[0]}:{owner[1]}): {e.strerror or e}; run as its owner or root") from None
            raise WriteRefused(f"cannot write {path}: {e.strerror or e}") from None
        except OSError as e:
            raise WriteRefused(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        os.close(lock)  # the lock goes with it
