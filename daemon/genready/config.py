"""The configuration: every setting defined once, parsed into frozen dataclasses.

A bad config is never a traceback: `ConfigError` names the file, the key path, what was
expected and what was found, and the CLI turns it into exit status 78 (EX_CONFIG).
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

from genready import apis, reach
from genready.compat import tomllib
from genready.reach import Endpoint
from genready.store.bounded import read_regular

if TYPE_CHECKING:
    import ssl

DEFAULT_PATH: Final = Path("/etc/genready/genready.toml")
BUSES: Final = ("system", "user")
LOG_LEVELS: Final = ("debug", "info", "warning", "error")
OWNERS: Final = ("process", "container")
_REQUIRED: Final = object()
_TARGET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# More targets than this is a mistake, not a host: each costs a probe task, a D-Bus match and
# fds, and the API answers about all of them. bench/hostile.py shows 200 staying responsive.
MAX_TARGETS: Final = 256
# systemd's own limit (UNIT_NAME_MAX, including the terminating NUL) and character set
# (unit_name_is_valid in src/basic/unit-name.c); '@' separates template and instance.
UNIT_NAME_MAX: Final = 256
_UNIT_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789:-_.\\@")
UTF8_BOM: Final = b"\xef\xbb\xbf"
# The config is read whole, at start and on every SIGHUP: a FIFO or /dev/zero named as the
# config froze the API or grew genready until the kernel killed it. A real one is a few KiB.
MAX_CONFIG_BYTES: Final = 1 << 20
MAX_KEY_BYTES: Final = 64 << 10  # an API key file



class ConfigError(Exception):
    """A user-facing configuration error: where, which key, expected vs found."""

    def __init__(self, file: str, key: str, expected: str, found: str = "") -> None:
        self.file, self.key, self.expected, self.found = file, key, expected, found
        where = f"{file}: {key}" if key else file
        tail = f", found {found}" if found else ""
        super().__init__(f"{where}: expected {expected}{tail}")


# A checker gets the (already type-checked) value and returns an error text, or None if fine.
Check = Callable[[Any], str | None]


@dataclass(frozen=True)
class Setting:
    name: str
    type: type
    default: Any
    help: str
    check: Check | None = None
    words: tuple[str, ...] = ()  # strings accepted besides values of `type` (load_timeout = "auto")
    restart: bool = False  # wired at start-up: a reload that changes it keeps the running value
    choices: tuple[str, ...] = ()  # the only values it takes (a CLI flag mirroring it offers these)

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED

    def problem(self, v: Any) -> str | None:
        """What is wrong with `v`, a value of the right type, or None."""
        if self.choices and v not in self.choices:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        return self.check(v) if self.check else None


def _listen(v: str) -> str | None:
    try:
        host, port = split_hostport(v)
    except ValueError:
        return "host:port (e.g. 127.0.0.1:9901 or [::1]:9901)"
    if not 0 < port < 65536:
        return "a port between 1 and 65535"
    if host != "localhost":
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return "an IP address or localhost as host"
    return None


def is_loopback(host: str) -> bool:
    """Is `host` (an IP address or "localhost") reachable only from this machine?"""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listen_warning(cfg: DaemonConfig) -> str | None:
    """A warning for an API reachable from other machines (it tells anyone which PIDs serve what)."""
    if is_loopback(cfg.host):
        return None
    return (f"daemon.listen = {cfg.listen!r} is not a loopback address: any host that can reach it can read "
            "genready's API (targets, units, PIDs, URLs); use 127.0.0.1 unless you mean it")


def _url(v: str) -> str | None:
    try:
        reach.endpoint(v)
    except ValueError as e:
        return str(e)
    return None


def _positive(v: float) -> str | None:
    return None if v > 0 and math.isfinite(v) else "a finite number > 0"


def _non_negative(v: float) -> str | None:
    return None if v >= 0 and math.isfinite(v) else "a finite number >= 0"


def _at_least_one(v: int) -> str | None:
    return None if v >= 1 else "an integer >= 1"


_HOST_NAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,62})(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62}))*\.?")


def _host_names(v: list[Any]) -> str | None:
    ok = all(isinstance(h, str) and (_HOST_NAME.fullmatch(h) or is_ip(h.strip("[]"))) for h in v)
    return None if ok else 'an array of host names or IP addresses, without ports (e.g. ["genready.lan"])'


def is_ip(v: str) -> bool:
    """Is `v` an IPv4 or IPv6 address (no brackets, no port)?"""
    try:
        ipaddress.ip_address(v)
    except ValueError:
        return False
    return True


def _abs_path(v: str) -> str | None:
    return None if os.path.isabs(v) else "an absolute path"


def _abs_path_or_empty(v: str) -> str | None:
    return None if not v or os.path.isabs(v) else "an absolute path, or empty"


def _container_name(v: str) -> str | None:
    # Docker's and podman's own rule for container names.
    ok = not v or re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*", v)
    return None if ok else "a container name ([a-zA-Z0-9][a-zA-Z0-9_.-]*), or empty"


def _http_path(empty: str) -> Check:
    """An HTTP path starting with "/", without query or fragment; "" means `empty`."""
    return lambda v: None if v == "" or (v.startswith("/") and "?" not in v and "#" not in v) else \
        f'an HTTP path starting with "/" (or "" {empty})'


# Token ids go to the server as JSON integers; a vocabulary has far fewer than 2**31 entries.
MAX_TOKEN_ID: Final = 2**31 - 1


def _token_ids(v: list[Any]) -> str | None:
    if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i <= MAX_TOKEN_ID for i in v):
        return f"an array of token ids (integers 0..{MAX_TOKEN_ID}), or [] to send the text prompt"
    return None


def _credential_name(v: str) -> str | None:
    # systemd's credential names are file names in $CREDENTIALS_DIRECTORY.
    return None if v == "" or (v not in (".", "..") and "/" not in v and "\0" not in v) else \
        "a credential name as in LoadCredential=NAME:… (no '/')"


def _kind(v: str) -> str | None:
    # The names are the server kinds' own (servers/kinds.py), read only when a config is checked: `genready wait`
    # parses no config, and the kinds bring asyncio with their flushes.
    from genready.servers.kinds import KINDS

    names = (AUTO, *(k.name for k in KINDS))
    return None if v in names else "one of " + ", ".join(repr(n) for n in names)


def check_unit(v: str) -> str | None:
    """What is wrong with `v` as a target's unit name, by systemd's own rules for a running service
    (plain or instance), or None. `genready init` checks its UNIT with it too."""
    prefix, dot, suffix = v.rpartition(".")
    if not dot or suffix != "service" or not prefix:
        return "a unit name ending in .service (e.g. sglang.service)"
    if len(v) >= UNIT_NAME_MAX:
        return f"a unit name of at most {UNIT_NAME_MAX - 1} characters (systemd's limit)"
    if bad := sorted(set(prefix) - _UNIT_CHARS):
        return ("a unit name of ASCII letters, digits and ':-_.\\@' only (systemd's rule), "
                f"without {''.join(bad)!r}")
    if prefix.startswith("@"):
        return "a unit name with a name before '@' (e.g. sglang@gpu0.service)"
    if prefix.endswith("@") and prefix.count("@") == 1:
        return ("an instance of the template, e.g. " + prefix + "gpu0.service "
                "(a template itself never runs, so it is never ready)")
    return None


# load_timeout = "auto": stuck after max(FACTOR x the usual load, FLOOR); without history, NO_HISTORY.
AUTO: Final = "auto"
LOAD_TIMEOUT_FACTOR: Final = 3.0
LOAD_TIMEOUT_FLOOR: Final = 300.0
LOAD_TIMEOUT_NO_HISTORY: Final = 1800.0


def stuck_after(load_timeout: float | str, expected: float | None) -> float:
    """Seconds of loading after which a target is `stuck`: a number means itself; "auto" scales
    with what this unit's loads usually take (expected_load_seconds)."""
    if load_timeout != AUTO:
        return float(load_timeout)
    if expected is None:
        return LOAD_TIMEOUT_NO_HISTORY
    return max(LOAD_TIMEOUT_FACTOR * expected, LOAD_TIMEOUT_FLOOR)


DAEMON_SETTINGS: Final = (
    Setting("listen", str, "127.0.0.1:9901",
            "host:port of the read-only HTTP API; loopback unless you mean it", _listen, restart=True),
    Setting("bus", str, "system", 'which systemd manager to watch: "system" or "user"', choices=BUSES,
            restart=True),
    Setting("state_dir", str, "/var/lib/genready", "start records live here", _abs_path, restart=True),
    Setting("runtime_dir", str, "/run/genready", "ready stamps live here", _abs_path, restart=True),
    Setting("log_level", str, "info", "debug, info, warning or error", choices=LOG_LEVELS),
    Setting("allowed_hosts", list, [],
            "Host: names the API answers besides the listen address, IP addresses and localhost; any other "
            "gets 421 (a web page using DNS rebinding to read the API)", _host_names),
    Setting("forget_removed_after", float, 30 * 86400.0,
            "seconds after which the start records of a target no longer configured are dropped; 0 = never",
            _non_negative),
    Setting("gpu_interval", float, 10.0,
            "seconds between reads of which processes hold GPU memory (also read at each start and end of a "
            "target's unit); 0 = off", _non_negative, restart=True),
)

TARGET_SETTINGS: Final = (
    Setting("unit", str, _REQUIRED, "the systemd unit that runs the server", check_unit),
    Setting("url", str, _REQUIRED, 'the server\'s base URL, or "unix:/path" for a unix socket', _url),
    Setting("api", str, "sglang", 'how to generate: "sglang" | "openai-completions" | "openai-chat"',
            choices=apis.NAMES),
    Setting("model", str, "", "model name for OpenAI APIs; empty: discovered from /v1/models"),
    Setting("prompt", str, "Say OK.", "the probe's prompt"),
    Setting("max_tokens", int, 1, "tokens the probe asks for", _at_least_one),
    Setting("probe_timeout", float, 30.0, "seconds one probe may take", _positive),
    Setting("backoff_initial", float, 0.25, "first retry delay after a timeout or slow answer, in seconds", _positive),
    Setting("backoff_max", float, 2.0, "longest retry delay of any kind, in seconds", _positive),
    Setting("warmup", int, 1, "consecutive successful generations needed", _at_least_one),
    Setting("load_timeout", float, AUTO, "seconds after which a loading server is 'stuck'; \"auto\": "
            f"{LOAD_TIMEOUT_FACTOR:g} x its usual load (expected_load_seconds), at least {LOAD_TIMEOUT_FLOOR:g} s; "
            f"{LOAD_TIMEOUT_NO_HISTORY:g} s while it has no verified load yet", _positive, words=(AUTO,)),
    Setting("recheck_interval", float, 0.0, "seconds between re-probes of a ready server; 0 = off",
            _non_negative),
    Setting("failure_threshold", int, 3, "consecutive failed rechecks that revoke readiness", _at_least_one),
    Setting("verify_owner", bool, True, "prove the answer came from the unit's MainPID or a descendant"),
    Setting("owner", str, "process",
            'what verify_owner proves: "process" (the MainPID or a descendant served it) or "container" '
            "(a container created by the unit's current start served it)", choices=OWNERS),
    Setting("container", str, "",
            'owner = "container": the container\'s name; empty: the --name of the unit\'s docker/podman run',
            _container_name),
    Setting("container_socket", str, "",
            "owner = \"container\": the engine's API socket; empty: /var/run/docker.sock or "
            "/run/podman/podman.sock", _abs_path_or_empty),
    Setting("gate_startup", bool, True, "hold genready's own READY=1 until this target was verified"),
    Setting("path_prefix", str, "", "for unix: URLs, the HTTP path the server's routes are under",
            _http_path("for none")),
    Setting("api_key_file", str, "", "file holding the server's API key, sent as Authorization: Bearer",
            _abs_path_or_empty),
    Setting("api_key_credential", str, "", "the same, from the systemd credential $CREDENTIALS_DIRECTORY/NAME",
            _credential_name),
    Setting("ca_file", str, "", "PEM bundle of CAs to trust for an https:// server, besides the system's",
            _abs_path_or_empty),
    Setting("tls_verify", bool, True, "verify the https:// server's certificate and name (false: warned)"),
    Setting("client_cert_file", str, "", "PEM client certificate for mutual TLS", _abs_path_or_empty),
    Setting("client_key_file", str, "", "its private key (if not in client_cert_file)", _abs_path_or_empty),
    Setting("health_path", str, "/health",
            "the server's own health route, asked first on the probe's connection: a probe verifies only if it "
            'answers 200; 404/405 = the server has none, the generation alone decides; "" = skip it',
            _http_path("to skip the server's own health check")),
    Setting("prompt_ids", list, [],
            "token ids sent instead of prompt, for a server without a tokenizer (--skip-tokenizer-init): "
            "input_ids (sglang) or prompt (openai-completions); [] = send prompt", _token_ids),
    Setting("kind", str, AUTO, 'which server the unit runs, e.g. "sglang" (a name of `genready init`\'s server '
            'kinds); "auto": from the command line of the process that serves the target, else the unit\'s '
            "ExecStart=", _kind),
)


@dataclass(frozen=True)
class DaemonConfig:
    listen: str
    bus: str
    state_dir: str
    runtime_dir: str
    log_level: str
    allowed_hosts: list[str]
    forget_removed_after: float
    gpu_interval: float = 10.0

    @property
    def host(self) -> str:
        return split_hostport(self.listen)[0]

    @property
    def port(self) -> int:
        return split_hostport(self.listen)[1]


@dataclass(frozen=True)
class TargetConfig:
    name: str
    unit: str
    url: str
    api: str
    model: str
    prompt: str
    max_tokens: int
    probe_timeout: float
    backoff_initial: float
    backoff_max: float
    warmup: int
    load_timeout: float | str  # seconds, or AUTO: use stuck_after()
    recheck_interval: float
    failure_threshold: int
    verify_owner: bool
    owner: str
    container: str
    container_socket: str
    gate_startup: bool
    path_prefix: str = ""
    api_key_file: str = ""
    api_key_credential: str = ""
    ca_file: str = ""
    tls_verify: bool = True
    client_cert_file: str = ""
    client_key_file: str = ""
    health_path: str = "/health"
    prompt_ids: tuple[int, ...] = ()
    kind: str = AUTO  # a server kind's name, or AUTO (probe/serverkind.py resolves it)
    # The key itself, read at load: compared (a rotated key is a changed config on SIGHUP) but
    # never printed (repr=False; to_toml_dict writes only the table's keys).
    api_key: str = field(default="", repr=False)

    # Derived from the fields above once per TargetConfig (a replace() derives anew); not compared.
    endpoint: Endpoint = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "endpoint", reach.endpoint(self.url, self.path_prefix))

    @property
    def unix_path(self) -> str | None:
        """The socket path of a unix: URL, else None."""
        return self.endpoint.unix_path

    @cached_property
    def tls_context(self) -> ssl.SSLContext | None:
        """The target's one TLS client context (None unless https): built when the config is read,
        which checks its files, then shared by every probe and the bench client. TlsSetupError
        names the key whose file is unusable."""
        if not self.endpoint.tls:
            return None
        return reach.client_context(self.ca_file, self.tls_verify, self.client_cert_file, self.client_key_file)

    @property
    def credential_unchecked(self) -> str:
        """For api_key_credential read outside genready.service: what only the service can check; else ""."""
        if not self.api_key_credential or self.api_key:
            return ""
        name = self.api_key_credential
        return (f"api_key_credential = {name!r}: its name is valid; whether the credential exists and holds one "
                f"line of printable ASCII only genready.service can check (systemd gives it "
                f"$CREDENTIALS_DIRECTORY/{name} from LoadCredential={name}:PATH or LoadCredentialEncrypted=); "
                "not checked here")

    @property
    def warnings(self) -> list[str]:
        """Settings that weaken what a verified start proves; logged and shown in /status."""
        out = []
        if not self.tls_verify and self.endpoint.tls:
            out.append("tls_verify = false: the server's certificate is not checked")
        if self.endpoint.unix_path is None and self.endpoint.host == "localhost":
            out.append(LOCALHOST_WARNING)
        return out


# A url with `localhost`: clients try each address it resolves to, and a server usually listens on one.
LOCALHOST_WARNING: Final = (
    "url names localhost, which resolves to ::1 and 127.0.0.1 on most hosts: a server listening on one of them "
    "leaves the other free for any local user to bind at the same port, and clients that try it first reach that "
    "process (genready then revokes readiness: foreign_listener); put the address the server listens on in url "
    "(http://127.0.0.1:PORT or http://[::1]:PORT)")


@dataclass(frozen=True)
class Config:
    path: str
    daemon: DaemonConfig
    targets: Mapping[str, TargetConfig]

    def only_target(self, named: str | None = None) -> str | None:
        """`named` if given, else the name of the only configured target; None when none is named and
        there are several (the caller says what that means: every target, or "name one")."""
        if named:
            return named
        return next(iter(self.targets)) if len(self.targets) == 1 else None

    def to_toml_dict(self) -> dict[str, Any]:
        """The effective config, defaults filled in, in the file's own shape."""
        targets = {name: {s.name: _plain(getattr(t, s.name)) for s in TARGET_SETTINGS}
                   for name, t in self.targets.items()}
        daemon = {f.name: getattr(self.daemon, f.name) for f in fields(self.daemon)}
        return {"daemon": daemon, "targets": targets}


def _plain(v: Any) -> Any:
    """A setting's value in TOML's terms: arrays are kept as tuples (frozen), written as lists."""
    return list(v) if isinstance(v, tuple) else v
def restart_needed(running: DaemonConfig, new: DaemonConfig) -> list[str]:
    """What a reload to `new` cannot change in a daemon running with `running` (its `restart`
    settings), worded for /status, the log and check-config."""
    return [f"restart needed: daemon.{s.name} changed (genready runs with {getattr(running, s.name)!r}, "
            f"the config says {getattr(new, s.name)!r})"
            for s in DAEMON_SETTINGS if s.restart and getattr(running, s.name) != getattr(new, s.name)]


def as_running(cfg: DaemonConfig, running: Mapping[str, object]) -> DaemonConfig:
    """`cfg` with the `restart` settings a running daemon reports (its runtime file) in their place."""
    values: dict[str, Any] = {s.name: str(running[s.name]) for s in DAEMON_SETTINGS
              if s.restart and isinstance(running.get(s.name), str)}
    return replace(cfg, **values)


def keep_running(running: DaemonConfig, new: DaemonConfig) -> DaemonConfig:
    """`new`, with the settings only a restart changes kept as they run."""
    return replace(new, **{s.name: getattr(running, s.name) for s in DAEMON_SETTINGS if s.restart})


def split_hostport(value: str) -> tuple[str, int]:
    """'127.0.0.1:9901' / '[::1]:9901' / 'localhost:9901' -> (host, port); ValueError otherwise."""
    m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\d+)|([^:\[\]]+):(\d+)", value)
    if not m:
        raise ValueError(value)
    host = m.group(1) or m.group(3)
    return host, int(m.group(2) or m.group(4))


def _type_name(t: type) -> str:
    return {str: "a string", int: "an integer", float: "a number", bool: "true or false", list: "an array"}[t]


def _found(v: Any) -> str:
    kind = {str: "string", bool: "boolean", int: "integer", float: "number", dict: "table", list: "array"}
    return f"{kind.get(type(v), type(v).__name__)} {v!r}" if not isinstance(v, dict) else "a table"


def _redacted(v: str) -> str:
    """A URL for an error message, password not shown (the message lands in logs and terminals)."""
    if not reach.has_userinfo(v):
        return _found(v)
    try:
        parts = urlsplit(v)
        host = parts.netloc.rpartition("@")[2]
        return f"string {parts._replace(netloc='USER:***@' + host).geturl()!r}"
    except ValueError:
        return "a string with user:password@ (not shown)"


def _parse_table(file: str, prefix: str, table: Any, settings: tuple[Setting, ...]) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise ConfigError(file, prefix, "a table", _found(table))
    known = {s.name for s in settings}
    for key in table:
        if key not in known:
            raise ConfigError(file, f"{prefix}.{key}", "one of the known keys: " + ", ".join(sorted(known)),
                              f"unknown key {key!r}")
    out: dict[str, Any] = {}
    for s in settings:
        key = f"{prefix}.{s.name}"
        if s.name not in table:
            if s.required:
                raise ConfigError(file, key, f"{_type_name(s.type)} ({s.help})",
                                  "nothing (the key is required)")
            out[s.name] = s.default
            continue
        v = table[s.name]
        if isinstance(v, str) and v in s.words:
            out[s.name] = v
            continue
        # bool is an int in Python, and an int is a fine float; nothing else converts silently.
        ok = isinstance(v, s.type) and not (s.type is int and isinstance(v, bool))
        if s.type is float and isinstance(v, int) and not isinstance(v, bool):
            try:
                v, ok = float(v), True
            except OverflowError:  # an integer beyond any float
                ok = False
        if not ok:
            raise ConfigError(file, key, " or ".join([_type_name(s.type), *(repr(w) for w in s.words)]), _found(v))
        if problem := s.problem(v):
            raise ConfigError(file, key, problem, _redacted(v) if s.name == "url" else _found(v))
        out[s.name] = list(v) if isinstance(v, list) else v  # a copy: the dataclass is frozen
    return out


def parse(data: Mapping[str, Any], file: str = "<config>", *, service: bool = True) -> Config:
    """Validate a decoded TOML document into a Config, or raise ConfigError. `service`: this is
    genready.service itself, so an api_key_credential must be readable now; outside it (check-config,
    init, the CLI) only its name can be checked, and the target says so (`credential_unchecked`)."""
    for key in data:
        if key not in ("daemon", "targets"):
            raise ConfigError(file, key, "only the tables [daemon] and [targets.NAME]",
                              f"unknown key {key!r}")
    daemon = DaemonConfig(**_parse_table(file, "daemon", data.get("daemon", {}), DAEMON_SETTINGS))
    raw_targets = data.get("targets")
    if raw_targets is None or raw_targets == {}:
        raise ConfigError(file, "targets", "at least one [targets.NAME] table", "none")
    if not isinstance(raw_targets, dict):
        raise ConfigError(file, "targets", "tables [targets.NAME]", _found(raw_targets))
    if len(raw_targets) > MAX_TARGETS:
        raise ConfigError(file, "targets", f"at most {MAX_TARGETS} targets (genready's documented limit)",
                          f"{len(raw_targets)} targets")
    targets: dict[str, TargetConfig] = {}
    for name, table in raw_targets.items():
        if not _TARGET_NAME.fullmatch(name):
            raise ConfigError(file, f"targets.{name}", "a target name of letters, digits, '_', '.', '-'",
                              repr(name))
        values = _parse_table(file, f"targets.{name}", table, TARGET_SETTINGS)
        if values["backoff_max"] < values["backoff_initial"]:
            raise ConfigError(file, f"targets.{name}.backoff_max", "a number >= backoff_initial",
                              repr(values["backoff_max"]))
        _check_transport(file, f"targets.{name}", values)
        if values["prompt_ids"] and not apis.APIS[values["api"]].takes_ids:
            raise ConfigError(file, f"targets.{name}.prompt_ids", "no prompt_ids with api = "
                              f"{values['api']!r} (token ids go to \"sglang\" or \"openai-completions\")",
                              _found(values["prompt_ids"]))
        values["prompt_ids"] = tuple(values["prompt_ids"])
        t = targets[name] = TargetConfig(name=name, api_key=_api_key(file, f"targets.{name}", values, service),
                                             **values)
        if t.endpoint.tls:
            try:  # ssl is loaded only for a config with an https target (reach imports it when used)
                t.tls_context  # noqa: B018  built now: a bad PEM file is a config error, not a probe failure
            except reach.TlsSetupError as e:
                raise ConfigError(file, f"targets.{name}.{e.key}", e.problem, repr(values[e.key])) from None
    return Config(path=file, daemon=daemon, targets=targets)


def _check_transport(file: str, prefix: str, v: dict[str, Any]) -> None:
    """Keys that only make sense together, and TLS files that must load."""
    unix, https = v["url"].startswith("unix:"), v["url"].startswith("https:")
    if v["path_prefix"] and not unix:
        raise ConfigError(file, f"{prefix}.path_prefix", "no path_prefix with an http(s) URL (put the path "
                          "in the url)", repr(v["path_prefix"]))
    for key in ("ca_file", "client_cert_file", "client_key_file"):
        if v[key] and not https:
            raise ConfigError(file, f"{prefix}.{key}", "an https:// url for TLS settings", f"url {v['url']!r}")
    if not v["tls_verify"] and not https:
        raise ConfigError(file, f"{prefix}.tls_verify", "an https:// url for TLS settings", f"url {v['url']!r}")
    if v["client_key_file"] and not v["client_cert_file"]:
        raise ConfigError(file, f"{prefix}.client_cert_file", "a client certificate for client_key_file",
                          "nothing")


def _api_key(file: str, prefix: str, v: dict[str, Any], service: bool = True) -> str:
    """The API key from api_key_file or api_key_credential, stripped; "" if neither is set, or for a
    credential outside the service (no $CREDENTIALS_DIRECTORY, `service` False)."""
    if v["api_key_file"] and v["api_key_credential"]:
        raise ConfigError(file, f"{prefix}.api_key_credential", "api_key_file or api_key_credential, not both",
                          "both")
    if v["api_key_file"]:
        key, path = f"{prefix}.api_key_file", v["api_key_file"]
    elif v["api_key_credential"]:
        key, name = f"{prefix}.api_key_credential", v["api_key_credential"]
        creds = os.environ.get("CREDENTIALS_DIRECTORY", "")
        if not creds and not service:
            return ""  # only the service can read it: TargetConfig.credential_unchecked says so
        if not creds:
            raise ConfigError(file, key, "$CREDENTIALS_DIRECTORY, set by systemd for a service with "
                              f"LoadCredential={name}:PATH (or LoadCredentialEncrypted=)",
                              f"credential {name!r} but $CREDENTIALS_DIRECTORY is not set")
        path = os.path.join(creds, name)
    else:
        return ""
    try:
        raw = read_regular(path, MAX_KEY_BYTES)
    except OSError as e:
        raise ConfigError(file, key, "a readable file holding the API key",
                          f"{path}: {e.strerror or e}") from None
    except ValueError as e:
        raise ConfigError(file, key, f"a regular file of at most {MAX_KEY_BYTES >> 10} KiB holding the API key",
                          f"{path}: {e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(file, key, "a UTF-8 text file holding the API key", f"{path}: undecodable bytes") from None
    # Lines starting with # are comments, as in llama.cpp's --api-key-file (common/arg.cpp), so the
    # server's own key file can be given as it is; one key line is left.
    lines = [ln.strip() for ln in text.splitlines()]
    keys = [ln for ln in lines if ln and not ln.startswith("#")]
    secret = keys[0] if len(keys) == 1 else "\n".join(keys)
    # Never echo the content: an error names the file and what is wrong with it, nothing more.
    if not secret:
        raise ConfigError(file, key, "a file holding the API key", f"{path}: empty")
    if not (secret.isascii() and secret.isprintable()):  # it goes into an HTTP header
        raise ConfigError(file, key, "one line of printable ASCII (the API key; # comment lines aside)",
                          f"{path}: several lines or non-ASCII characters")
    return secret


def resolve_path(cli_path: str | None) -> Path:
    """--config wins, then $GENREADY_CONFIG, then /etc/genready/genready.toml."""
    return Path(cli_path or os.environ.get("GENREADY_CONFIG") or DEFAULT_PATH)


def load(path: Path, *, service: bool = True) -> Config:
    """Read and validate a config file, or raise ConfigError. It blocks (a file on a hung network
    mount): the daemon calls it off its event loop, with a bounded wait."""
    return parse(read_toml(path, MAX_CONFIG_BYTES), str(path), service=service)


def read_toml(path: Path, cap: int) -> dict[str, Any]:
    """A regular TOML file of at most `cap` bytes, as a table; else ConfigError naming the file.
    The one reader of the config and of sweep plans."""
    try:
        raw = read_regular(path, cap)
    except OSError as e:
        raise ConfigError(str(path), "", "a readable TOML file", e.strerror or str(e)) from None
    except ValueError as e:
        raise ConfigError(str(path), "", f"a regular file of at most {cap >> 20} MiB", str(e)) from None
    if raw.startswith(UTF8_BOM):
        # Some Windows editors save one; TOML parsers then report "invalid statement" at 1:1.
        raise ConfigError(str(path), "", "UTF-8 text without a byte-order mark",
                          "a UTF-8 byte-order mark (BOM) at the start: save the file as plain UTF-8") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(str(path), "", "UTF-8 text", "undecodable bytes") from None
    except ValueError as e:  # TOMLDecodeError, or tomllib's int() on an integer of > 4300 digits
        raise ConfigError(str(path), "", "valid TOML", str(e)) from None
    return data
