"""The config contract: a bad config is a clear error (file, key path, expected vs found) and
exit status 78, never a traceback; `genready check-config` prints the effective config as TOML.

Bad configs run through the real CLI in a subprocess, because "never a traceback" is a promise
about what the user sees, not about what `config.load` raises.
"""

from __future__ import annotations

import enum
import os
import re
import subprocess
import sys
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from genready import config, reach
from genready.compat import tomllib
from genready.exitcodes import Exit

REPO = Path(__file__).resolve().parent.parent
SHIPPED = REPO / "config" / "genready.toml"

TARGET = """\
[targets.sglang]
unit = "sglang.service"
url = "http://127.0.0.1:30000"
"""


class Special(enum.Enum):
    """A config "file" that is not a file of text."""

    DIRECTORY = "a directory where the file should be"
    MISSING = "no file at all"


@dataclass(frozen=True)
class Bad:
    id: str
    content: str | bytes | Special
    key: str  # the key path the error must name; "" for file-level errors
    found: str  # must appear in stderr ("" if there is nothing to show)
    expected: str = ""  # must appear in stderr after "expected" ("" to skip)


def target(**kv: str) -> str:
    """TARGET with extra lines `key = <raw TOML value>` appended."""
    return TARGET + "".join(f"{k} = {v}\n" for k, v in kv.items())


def daemon(**kv: str) -> str:
    """A [daemon] table with the given raw TOML values, followed by a valid target."""
    return "[daemon]\n" + "".join(f"{k} = {v}\n" for k, v in kv.items()) + "\n" + TARGET


T = "targets.sglang"
BAD: list[Bad] = [
    # wrong types
    Bad("string-for-float", target(probe_timeout='"30"'), f"{T}.probe_timeout", "string '30'", "a number"),
    Bad("bool-for-int", target(max_tokens="true"), f"{T}.max_tokens", "boolean True", "an integer"),
    Bad("int-for-bool", target(verify_owner="1"), f"{T}.verify_owner", "integer 1", "true or false"),
    Bad("float-for-int", target(warmup="1.5"), f"{T}.warmup", "number 1.5", "an integer"),
    Bad("table-for-string", daemon(listen='{ host = "127.0.0.1", port = 9901 }'), "daemon.listen",
        "a table", "a string"),
    Bad("array-for-string", target(prompt='["Say", "OK."]'), f"{T}.prompt", "array ['Say', 'OK.']",
        "a string"),
    Bad("string-for-token-ids", target(prompt_ids='"1 2"'), f"{T}.prompt_ids", "string '1 2'", "an array"),
    Bad("text-in-token-ids", target(prompt_ids='[1, "2"]'), f"{T}.prompt_ids", "array [1, '2']",
        "an array of token ids"),
    Bad("negative-token-id", target(prompt_ids="[-1]"), f"{T}.prompt_ids", "array [-1]", "token ids"),
    Bad("token-ids-for-chat", target(prompt_ids="[1]", api='"openai-chat"'), f"{T}.prompt_ids", "array [1]",
        "no prompt_ids with api = 'openai-chat'"),
    Bad("health-path-without-slash", target(health_path='"health"'), f"{T}.health_path", "string 'health'",
        'an HTTP path starting with "/"'),
    Bad("int-too-big-for-float", target(probe_timeout="9" * 400), f"{T}.probe_timeout", "integer 999",
        "a number"),
    Bad("daemon-not-a-table", 'daemon = "127.0.0.1:9901"\n' + TARGET, "daemon", "string '127.0.0.1:9901'",
        "a table"),
    Bad("target-not-a-table", '[targets]\nsglang = "sglang.service"\n', T, "string 'sglang.service'",
        "a table"),
    Bad("targets-not-a-table", 'targets = ["sglang"]\n', "targets", "array ['sglang']"),
    # unknown keys: typos must not pass silently
    Bad("unknown-daemon-key", daemon(listne='"127.0.0.1:9901"'), "daemon.listne", "unknown key 'listne'",
        "one of the known keys"),
    Bad("unknown-target-key-typo", target(probe_timout="5.0"), f"{T}.probe_timout",
        "unknown key 'probe_timout'", "one of the known keys"),
    Bad("unknown-top-level-table", '[deamon]\nbus = "user"\n\n' + TARGET, "deamon", "unknown key 'deamon'"),
    Bad("unknown-top-level-key", "verbose = true\n" + TARGET, "verbose", "unknown key 'verbose'"),
    Bad("unknown-sub-table-in-target", TARGET + "[targets.sglang.probe]\ntimeout = 5\n",
        f"{T}.probe", "unknown key 'probe'"),
    # url
    Bad("url-no-scheme", target().replace('"http://127.0.0.1:30000"', '"127.0.0.1:30000"'),
        f"{T}.url", "string '127.0.0.1:30000'", "an http:// or https:// URL"),
    Bad("url-ftp", target().replace('"http://', '"ftp://'), f"{T}.url", "string 'ftp://127.0.0.1:30000'",
        "an http:// or https:// URL"),
    Bad("url-no-host", target().replace('"http://127.0.0.1:30000"', '"http://:30000"'),
        f"{T}.url", "string 'http://:30000'"),
    Bad("url-port-out-of-range", target().replace(":30000", ":99999"), f"{T}.url",
        "string 'http://127.0.0.1:99999'"),
    Bad("url-port-zero", target().replace(":30000", ":0"), f"{T}.url", "string 'http://127.0.0.1:0'"),
    Bad("url-port-not-a-number", target().replace(":30000", ":http"), f"{T}.url",
        "string 'http://127.0.0.1:http'"),
    Bad("url-unclosed-ipv6", target().replace("127.0.0.1:30000", "[::1:30000"), f"{T}.url",
        "string 'http://[::1:30000'"),
    Bad("url-with-query", target().replace(":30000", ":30000/?model=x"), f"{T}.url",
        "string 'http://127.0.0.1:30000/?model=x'", "a base URL without query"),
    # listen
    Bad("listen-no-port", daemon(listen='"127.0.0.1"'), "daemon.listen", "string '127.0.0.1'", "host:port"),
    Bad("listen-port-0", daemon(listen='"127.0.0.1:0"'), "daemon.listen", "string '127.0.0.1:0'",
        "a port between 1 and 65535"),
    Bad("listen-port-70000", daemon(listen='"127.0.0.1:70000"'), "daemon.listen",
        "string '127.0.0.1:70000'", "a port between 1 and 65535"),
    Bad("listen-hostname", daemon(listen='"genready.example.com:9901"'), "daemon.listen",
        "string 'genready.example.com:9901'", "an IP address or localhost"),
    Bad("listen-ipv6-unbracketed", daemon(listen='"::1:9901"'), "daemon.listen", "string '::1:9901'",
        "host:port"),
    # choices
    Bad("bad-api", target(api='"vllm"'), f"{T}.api", "string 'vllm'", "one of 'sglang'"),
    Bad("bad-bus", daemon(bus='"session"'), "daemon.bus", "string 'session'", "one of 'system', 'user'"),
    Bad("bad-log-level", daemon(log_level='"verbose"'), "daemon.log_level", "string 'verbose'", "one of"),
    # paths and units
    Bad("relative-state-dir", daemon(state_dir='"var/lib/genready"'), "daemon.state_dir",
        "string 'var/lib/genready'", "an absolute path"),
    Bad("relative-runtime-dir", daemon(runtime_dir='"./run"'), "daemon.runtime_dir", "string './run'",
        "an absolute path"),
    Bad("unit-without-service", target().replace('"sglang.service"', '"sglang"'), f"{T}.unit",
        "string 'sglang'", "a unit name ending in .service"),
    Bad("unit-is-a-socket", target().replace('"sglang.service"', '"sglang.socket"'), f"{T}.unit",
        "string 'sglang.socket'", "a unit name ending in .service"),
    # targets
    Bad("empty-targets-table", "[targets]\n", "targets", "none", "at least one [targets.NAME] table"),
    Bad("missing-targets", '[daemon]\nbus = "user"\n', "targets", "none", "at least one [targets.NAME]"),
    Bad("missing-unit", '[targets.sglang]\nurl = "http://127.0.0.1:30000"\n', f"{T}.unit",
        "nothing (the key is required)"),
    Bad("missing-url", '[targets.sglang]\nunit = "sglang.service"\n', f"{T}.url",
        "nothing (the key is required)"),
    Bad("error-in-second-target", TARGET + '\n[targets.vllm]\nunit = "vllm.service"\nurl = "vllm:8000"\n',
        "targets.vllm.url", "string 'vllm:8000'"),
    Bad("bad-target-name", TARGET.replace("[targets.sglang]", '[targets."my server"]'),
        "targets.my server", "'my server'", "a target name"),
    Bad("target-name-leading-dash", TARGET.replace("[targets.sglang]", "[targets.-x]"), "targets.-x",
        "'-x'", "a target name"),
    Bad("dotted-target-name-unquoted", TARGET.replace("[targets.sglang]", "[targets.llama-3.1_8b]"),
        "targets.llama-3.1_8b", "unknown key '1_8b'"),
    # numbers out of range
    Bad("backoff-max-below-initial", target(backoff_initial="1.0", backoff_max="0.5"), f"{T}.backoff_max",
        "0.5", "a number >= backoff_initial"),
    Bad("negative-recheck-interval", target(recheck_interval="-1.0"), f"{T}.recheck_interval",
        "number -1.0", "a finite number >= 0"),
    Bad("warmup-zero", target(warmup="0"), f"{T}.warmup", "integer 0", "an integer >= 1"),
    Bad("max-tokens-negative", target(max_tokens="-1"), f"{T}.max_tokens", "integer -1", "an integer >= 1"),
    Bad("probe-timeout-zero", target(probe_timeout="0.0"), f"{T}.probe_timeout", "number 0.0",
        "a finite number > 0"),
    Bad("probe-timeout-inf", target(probe_timeout="inf"), f"{T}.probe_timeout", "number inf",
        "a finite number > 0"),
    Bad("recheck-interval-nan", target(recheck_interval="nan"), f"{T}.recheck_interval", "number nan"),
    Bad("failure-threshold-zero", target(failure_threshold="0"), f"{T}.failure_threshold", "integer 0"),
    # credentials, TLS, unix sockets (files that exist are tested below, with real files)
    Bad("api-key-file-missing", target(api_key_file='"/nonexistent/genready.key"'), f"{T}.api_key_file",
        "/nonexistent/genready.key: No such file or directory", "a readable file holding the API key"),
    Bad("api-key-file-relative", target(api_key_file='"genready.key"'), f"{T}.api_key_file",
        "string 'genready.key'", "an absolute path"),
    Bad("api-key-credential-without-systemd", target(api_key_credential='"vllm-key"'),
        f"{T}.api_key_credential", "credential 'vllm-key' but $CREDENTIALS_DIRECTORY is not set",
        "$CREDENTIALS_DIRECTORY"),
    Bad("api-key-credential-with-slash", target(api_key_credential='"a/b"'), f"{T}.api_key_credential",
        "string 'a/b'", "a credential name"),
    Bad("ca-file-with-http", target(ca_file='"/etc/ssl/certs/ca-certificates.crt"'), f"{T}.ca_file",
        "url 'http://127.0.0.1:30000'", "an https:// url"),
    Bad("tls-verify-with-http", target(tls_verify="false"), f"{T}.tls_verify", "url 'http://127.0.0.1:30000'"),
    Bad("ca-file-missing", target(ca_file='"/nonexistent/ca.pem"').replace("http://", "https://"),
        f"{T}.ca_file", "'/nonexistent/ca.pem'", "a readable PEM bundle"),
    Bad("client-key-without-cert", target(client_key_file='"/k.pem"').replace("http://", "https://"),
        f"{T}.client_cert_file", "nothing", "a client certificate"),
    Bad("unix-relative", target().replace('"http://127.0.0.1:30000"', '"unix:run/vllm.sock"'), f"{T}.url",
        "string 'unix:run/vllm.sock'", "unix:/absolute/path"),
    Bad("path-prefix-with-http", target(path_prefix='"/v2"'), f"{T}.path_prefix", "'/v2'",
        "no path_prefix with an http(s) URL"),
    Bad("path-prefix-relative", target(path_prefix='"v2"').replace('"http://127.0.0.1:30000"', '"unix:/s"'),
        f"{T}.path_prefix", "string 'v2'", 'an HTTP path starting with "/"'),
    # the file itself
    Bad("path-is-a-directory", Special.DIRECTORY, "", "a directory", "a regular file of at most 1 MiB"),
    Bad("file-missing", Special.MISSING, "", "No such file or directory", "a readable TOML file"),
    Bad("invalid-toml", TARGET + "warmup = \n", "", "", "valid TOML"),
    Bad("duplicate-key", TARGET + "unit = \"other.service\"\n", "", "", "valid TOML"),
    Bad("integer-beyond-parser-limit", TARGET + "warmup = " + "9" * 5000 + "\n", "", "", "valid TOML"),
    Bad("non-utf8-bytes", TARGET.encode() + b'prompt = "Sag \xe4hm."\n', "", "undecodable bytes",
        "UTF-8 text"),
]


def materialize(tmp_path: Path, content: str | bytes | Special) -> Path:
    path = tmp_path / "genready.toml"
    if content is Special.DIRECTORY:
        path.mkdir()
    elif content is Special.MISSING:
        pass
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "GENREADY_CONFIG"}
    env.update(extra)
    return env


def check_config(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "genready.cli", "check-config", *args],
        capture_output=True, text=True, env=clean_env() if env is None else env, timeout=30, check=False,
    )


def printed_config(out: str) -> dict[str, Any]:
    """The TOML check-config printed, parsed (its first line is a comment naming the file)."""
    assert out.startswith("# "), out
    return tomllib.loads(out)


# Outside genready.service, check-config checks a credential's name only and says what only the service
# can check (tests/test_hostile_inputs.py); `serve` and config.load still refuse it.
CHECK_CONFIG_BAD = [c for c in BAD if c.id != "api-key-credential-without-systemd"]


@pytest.mark.parametrize("case", CHECK_CONFIG_BAD, ids=[c.id for c in CHECK_CONFIG_BAD])
@pytest.mark.system
def test_bad_config_is_a_clear_error_with_exit_78(tmp_path: Path, case: Bad) -> None:
    path = materialize(tmp_path, case.content)
    r = check_config("--config", str(path))
    assert r.returncode == Exit.CONFIG, r.stderr
    assert "Traceback" not in r.stderr
    assert r.stdout == ""
    first = r.stderr.splitlines()[0]
    # genready: FILE: KEY: expected EXPECTED, found FOUND
    where = f"{path}: {case.key}: expected " if case.key else f"{path}: expected "
    assert first.startswith(f"genready: {where}"), first
    if case.expected:
        assert case.expected in first.split("expected ", 1)[1], first
    if case.found:
        assert f"found {case.found}" in first, first


@pytest.mark.parametrize("case", [c for c in BAD if c.key], ids=[c.id for c in BAD if c.key])
def test_bad_config_error_names_the_exact_key(tmp_path: Path, case: Bad) -> None:
    """In process, the ConfigError carries exactly the key path (not merely a substring)."""
    path = materialize(tmp_path, case.content)
    with pytest.raises(config.ConfigError) as err:
        config.load(path)
    assert (err.value.file, err.value.key) == (str(path), case.key)


@pytest.mark.system
def test_shipped_example_is_valid_and_printed_as_effective_config() -> None:
    r = check_config("--config", str(SHIPPED))
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert r.stdout.startswith(f"# {SHIPPED}: valid")
    effective = config.load(SHIPPED).to_toml_dict()
    assert printed_config(r.stdout) == effective
    # The example spells every setting out, so nothing is added: file == effective config.
    assert tomllib.loads(SHIPPED.read_text(encoding="utf-8")) == effective


def test_shipped_example_shows_the_defaults() -> None:
    """Apart from the required keys, every value in the example is the default, as its comments imply."""
    data = tomllib.loads(SHIPPED.read_text(encoding="utf-8"))
    assert data["daemon"] == {s.name: s.default for s in config.DAEMON_SETTINGS}
    for name, table in data["targets"].items():
        optional = {k: v for k, v in table.items() if k not in ("unit", "url")}
        assert optional == {s.name: s.default for s in config.TARGET_SETTINGS if not s.required}, name


@pytest.mark.system
def test_minimal_config_gets_every_default(tmp_path: Path) -> None:
    path = materialize(tmp_path, TARGET)
    r = check_config("--config", str(path))
    assert r.returncode == 0, r.stderr
    printed = printed_config(r.stdout)
    assert printed["daemon"] == {s.name: s.default for s in config.DAEMON_SETTINGS}
    expected_target = {s.name: s.default for s in config.TARGET_SETTINGS if not s.required}
    expected_target |= {"unit": "sglang.service", "url": "http://127.0.0.1:30000"}
    assert printed["targets"] == {"sglang": expected_target}
    # Same keys in the same order as the settings tables: the printout reads like the example.
    assert list(printed["daemon"]) == [s.name for s in config.DAEMON_SETTINGS]
    assert list(printed["targets"]["sglang"]) == [s.name for s in config.TARGET_SETTINGS]
    for s in config.TARGET_SETTINGS:  # float defaults print as floats, bools as bools
        assert type(printed["targets"]["sglang"][s.name]) is s.type or s.default in s.words, s.name


@pytest.mark.parametrize("source", ["minimal", "shipped", "two-targets"])
@pytest.mark.system
def test_printed_config_round_trips(tmp_path: Path, source: str) -> None:
    text = {
        "minimal": TARGET,
        "shipped": SHIPPED.read_text(encoding="utf-8"),
        "two-targets": daemon(bus='"user"', listen='"[::1]:9902"')
        + '\n[targets.vllm]\nunit = "vllm.service"\nurl = "https://gpu-1.internal:8000/base"\n'
        + 'api = "openai-chat"\nmodel = "m"\nprobe_timeout = 5\n',
    }[source]
    first = materialize(tmp_path, text)
    r1 = check_config("--config", str(first))
    assert r1.returncode == 0, r1.stderr
    second = tmp_path / "printed.toml"
    second.write_text(r1.stdout, encoding="utf-8")
    r2 = check_config("--config", str(second))
    assert r2.returncode == 0, r2.stderr
    # Identical apart from the header line naming the file.
    assert r1.stdout.split("\n", 1)[1] == r2.stdout.split("\n", 1)[1]
    assert replace(config.load(second), path=str(first)) == config.load(first)


@pytest.mark.system
def test_genready_config_env_is_honoured(tmp_path: Path) -> None:
    path = materialize(tmp_path, TARGET)
    r = check_config(env=clean_env(GENREADY_CONFIG=str(path)))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"# {path}: valid")


@pytest.mark.system
def test_config_flag_beats_env(tmp_path: Path) -> None:
    good = materialize(tmp_path, TARGET)
    missing = tmp_path / "nope.toml"
    r = check_config("--config", str(good), env=clean_env(GENREADY_CONFIG=str(missing)))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"# {good}: valid")
    # And the other way round: a bad --config fails even though the env names a good file.
    r = check_config("--config", str(missing), env=clean_env(GENREADY_CONFIG=str(good)))
    assert r.returncode == 78
    assert str(missing) in r.stderr and "Traceback" not in r.stderr


def test_default_path_when_neither_flag_nor_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GENREADY_CONFIG", raising=False)
    assert config.resolve_path(None) == config.DEFAULT_PATH == Path("/etc/genready/genready.toml")
    monkeypatch.setenv("GENREADY_CONFIG", "/tmp/env.toml")
    assert config.resolve_path(None) == Path("/tmp/env.toml")
    assert config.resolve_path("/tmp/flag.toml") == Path("/tmp/flag.toml")


@pytest.mark.system
def test_default_path_is_named_when_it_is_missing() -> None:
    if config.DEFAULT_PATH.exists():
        pytest.skip(f"{config.DEFAULT_PATH} exists on this machine")
    r = check_config()
    assert r.returncode == 78
    assert f"genready: {config.DEFAULT_PATH}: expected a readable TOML file" in r.stderr


@pytest.mark.system
def test_ints_are_accepted_for_float_settings(tmp_path: Path) -> None:
    floats = [s.name for s in config.TARGET_SETTINGS if s.type is float]
    path = materialize(tmp_path, target(**{name: "7" for name in floats}))
    r = check_config("--config", str(path))
    assert r.returncode == 0, r.stderr
    printed = printed_config(r.stdout)["targets"]["sglang"]
    for name in floats:
        assert printed[name] == 7.0 and isinstance(printed[name], float), name
        assert re.search(rf"^{name} = 7\.0$", r.stdout, re.MULTILINE), name
    t = config.load(path).targets["sglang"]
    assert all(type(getattr(t, name)) is float for name in floats)


GOOD_VARIANTS = {
    "health-off-and-token-ids": target(health_path='""', prompt_ids="[9707, 11]"),
    "listen-localhost": daemon(listen='"localhost:9901"'),
    "listen-ipv6": daemon(listen='"[::1]:9901"'),
    "listen-any": daemon(listen='"0.0.0.0:9901"'),
    "bus-user": daemon(bus='"user"'),
    "https-with-path": target().replace('"http://127.0.0.1:30000"', '"https://gpu-1.internal/sglang"'),
    "url-ipv6": target().replace("127.0.0.1", "[::1]"),
    "openai-chat": target(api='"openai-chat"', model='"llama"'),
    "openai-completions": target(api='"openai-completions"'),
    "template-instance-unit": target().replace('"sglang.service"', '"sglang@gpu0.service"'),
    "recheck-interval-int": target(recheck_interval="60"),
    "backoff-equal": target(backoff_initial="1", backoff_max="1.0"),
    "no-daemon-table": TARGET,
    "target-name-dots-dashes": TARGET.replace("[targets.sglang]", '[targets."llama-3.1_8b"]'),
}


@pytest.mark.parametrize("text", GOOD_VARIANTS.values(), ids=GOOD_VARIANTS.keys())
def test_good_variants_parse(tmp_path: Path, text: str) -> None:
    cfg = config.load(materialize(tmp_path, text))
    assert cfg.targets
    assert 0 < cfg.daemon.port < 65536


def test_settings_tables_match_the_dataclasses() -> None:
    assert [s.name for s in config.DAEMON_SETTINGS] == [f.name for f in fields(config.DaemonConfig)]
    target_fields = [f.name for f in fields(config.TargetConfig)]
    # api_key is read from the file api_key_file/api_key_credential names: not a setting itself;
    # endpoint is the url (and path_prefix) parsed.
    assert ["name", *(s.name for s in config.TARGET_SETTINGS), "api_key", "endpoint"] == target_fields


@pytest.mark.parametrize("s", config.DAEMON_SETTINGS + config.TARGET_SETTINGS, ids=lambda s: s.name)
def test_every_default_passes_its_own_checks(s: config.Setting) -> None:
    assert s.help
    if s.required:
        return
    if s.default in s.words:  # a word such as load_timeout = "auto"
        return
    assert type(s.default) is s.type
    assert s.check is None or s.check(s.default) is None


def shipped_keys() -> dict[str, dict[str, str]]:
    """{section header: {key: its trailing comment}} of the shipped example, read line by line."""
    sections: dict[str, dict[str, str]] = {}
    current = ""
    for line in SHIPPED.read_text(encoding="utf-8").splitlines():
        if m := re.match(r"^\s*\[([^\]]+)\]", line):
            current = m.group(1).strip()
            sections.setdefault(current, {})
        elif m := re.match(r"^\s*([A-Za-z_][A-Za-z0-9_-]*)\s*=[^#]*?(?:#\s*(.*))?$", line):
            sections.setdefault(current, {})[m.group(1)] = (m.group(2) or "").strip()
    return sections


def test_shipped_example_documents_every_setting() -> None:
    sections = shipped_keys()
    daemon_keys = sections.get("daemon", {})
    for s in config.DAEMON_SETTINGS:
        assert s.name in daemon_keys, f"[daemon] {s.name} missing from {SHIPPED}"
        assert daemon_keys[s.name], f"[daemon] {s.name} has no # comment in {SHIPPED}"
    target_sections = [k for k in sections if k.startswith("targets.")]
    assert target_sections, f"no [targets.NAME] table in {SHIPPED}"
    for section in target_sections:
        for s in config.TARGET_SETTINGS:
            assert s.name in sections[section], f"[{section}] {s.name} missing from {SHIPPED}"
            assert sections[section][s.name], f"[{section}] {s.name} has no # comment in {SHIPPED}"


def test_shipped_example_has_no_undocumented_extras() -> None:
    """The line reader above sees exactly the keys tomllib sees (so the documentation test is sound)."""
    data = tomllib.loads(SHIPPED.read_text(encoding="utf-8"))
    sections = shipped_keys()
    assert set(sections["daemon"]) == set(data["daemon"])
    for name, table in data["targets"].items():
        assert set(sections[f"targets.{name}"]) == set(table)


def test_error_message_shape() -> None:
    e = config.ConfigError("/x.toml", "targets.a.url", "an http URL", "string 'ftp://h'")
    assert str(e) == "/x.toml: targets.a.url: expected an http URL, found string 'ftp://h'"
    assert str(config.ConfigError("/x.toml", "", "valid TOML")) == "/x.toml: expected valid TOML"


def test_tomli_w_can_print_every_default() -> None:
    """check-config prints with tomli_w; a default it cannot serialize would be a traceback."""
    cfg = config.parse(tomllib.loads(TARGET))
    assert tomllib.loads(tomli_w.dumps(cfg.to_toml_dict())) == cfg.to_toml_dict()


# --- credentials: the key is read at load, never printed ------------------------------------------

KEY = "sk-genready-test-4d9c1f"


@pytest.mark.system
def test_api_key_file_is_read_stripped_and_never_printed(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text(f"  {KEY}\n")
    path = materialize(tmp_path, target(api_key_file=f'"{key}"'))
    assert config.load(path).targets["sglang"].api_key == KEY
    assert KEY not in repr(config.load(path))
    r = check_config("--config", str(path))
    assert r.returncode == 0, r.stderr
    assert KEY not in r.stdout + r.stderr
    assert printed_config(r.stdout)["targets"]["sglang"]["api_key_file"] == str(key)


@pytest.mark.system
def test_api_key_credential_reads_credentials_directory(tmp_path: Path) -> None:
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "vllm-key").write_text(KEY)
    path = materialize(tmp_path, target(api_key_credential='"vllm-key"'))
    r = check_config("--config", str(path), env=clean_env(CREDENTIALS_DIRECTORY=str(creds)))
    assert r.returncode == 0, r.stderr
    assert KEY not in r.stdout + r.stderr
    (creds / "vllm-key").unlink()
    r = check_config("--config", str(path), env=clean_env(CREDENTIALS_DIRECTORY=str(creds)))
    assert r.returncode == 78
    assert f"{T}.api_key_credential" in r.stderr and "No such file" in r.stderr


@pytest.mark.parametrize(("content", "says"), [
    (b"", "empty"), (b"  \n", "empty"), (b"sk-first\nsk-second\n", "several lines"), (b"\xff\xfe", "undecodable"),
])
@pytest.mark.system
def test_unusable_api_key_file_is_exit_78_without_its_content(tmp_path: Path, content: bytes, says: str) -> None:
    key = tmp_path / "key"
    key.write_bytes(content)
    r = check_config("--config", str(materialize(tmp_path, target(api_key_file=f'"{key}"'))))
    assert r.returncode == 78, r
    assert f"{T}.api_key_file" in r.stderr and says in r.stderr
    assert "sk-" not in r.stderr


def test_comment_lines_in_a_key_file_are_skipped_as_llama_cpp_does(tmp_path: Path) -> None:
    # llama.cpp's --api-key-file skips lines starting with # (common/arg.cpp): its file works as is
    key = tmp_path / "key"
    key.write_text(f"# the server's key\n\n{KEY}\n# rotated 2026-01\n")
    t = config.load(materialize(tmp_path, target(api_key_file=f'"{key}"'))).targets["sglang"]
    assert t.api_key == KEY
    key.write_text(f"# two keys\n{KEY}\n{KEY}-2\n")
    with pytest.raises(config.ConfigError) as err:
        config.load(materialize(tmp_path, target(api_key_file=f'"{key}"')))
    assert "several lines" in str(err.value) and KEY not in str(err.value)
    key.write_text("# only a comment\n")
    with pytest.raises(config.ConfigError) as err:
        config.load(materialize(tmp_path, target(api_key_file=f'"{key}"')))
    assert "empty" in str(err.value)


def test_both_key_sources_is_an_error(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text(KEY)
    with pytest.raises(config.ConfigError) as err:
        config.load(materialize(tmp_path, target(api_key_file=f'"{key}"', api_key_credential='"k"')))
    assert err.value.key == f"{T}.api_key_credential"


def test_a_rotated_key_is_a_changed_config(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text(KEY)
    path = materialize(tmp_path, target(api_key_file=f'"{key}"'))
    before = config.load(path)
    key.write_text(KEY + "-2")
    assert config.load(path) != before


def test_unix_url_and_path_prefix(tmp_path: Path) -> None:
    content = target(path_prefix='"/api"').replace('"http://127.0.0.1:30000"', '"unix:/run/vllm/api.sock"')
    t = config.load(materialize(tmp_path, content)).targets["sglang"]
    assert (t.unix_path, t.path_prefix) == ("/run/vllm/api.sock", "/api")


def test_a_localhost_url_is_a_warning(tmp_path: Path) -> None:
    t = config.load(materialize(tmp_path, target().replace("127.0.0.1", "localhost"))).targets["sglang"]
    assert t.warnings == [config.LOCALHOST_WARNING] and "any local user" in t.warnings[0]
    assert config.load(materialize(tmp_path, target())).targets["sglang"].warnings == []


@pytest.mark.system
def test_tls_verify_false_is_a_warning(tmp_path: Path) -> None:
    content = target(tls_verify="false").replace("http://", "https://")
    t = config.load(materialize(tmp_path, content)).targets["sglang"]
    assert t.warnings == ["tls_verify = false: the server's certificate is not checked"]
    r = check_config("--config", str(tmp_path / "genready.toml"))
    assert r.returncode == 0 and f"warning: {T}: tls_verify = false" in r.stderr


@pytest.mark.system
def test_a_file_that_is_not_pem_is_a_config_error(tmp_path: Path) -> None:
    bogus = tmp_path / "ca.pem"
    bogus.write_text("not a certificate\n")
    content = target(ca_file=f'"{bogus}"').replace("http://", "https://")
    r = check_config("--config", str(materialize(tmp_path, content)))
    assert r.returncode == 78, r
    assert f"{T}.ca_file" in r.stderr and "PEM" in r.stderr


def test_load_timeout_auto_and_numbers(tmp_path: Path) -> None:
    t = config.load(materialize(tmp_path, target())).targets["sglang"]
    assert t.load_timeout == "auto"  # the default
    assert config.stuck_after("auto", None) == 1800.0  # no verified load yet: as before
    assert config.stuck_after("auto", 20.0) == 300.0  # never below 5 minutes
    assert config.stuck_after("auto", 400.0) == 1200.0  # 3 x the usual load
    assert config.stuck_after(90.0, 400.0) == 90.0  # a number keeps its meaning
    t = config.load(materialize(tmp_path, target(load_timeout="600"))).targets["sglang"]
    assert t.load_timeout == 600.0
    with pytest.raises(config.ConfigError, match="load_timeout: expected a number or 'auto', found string 'soon'"):
        config.load(materialize(tmp_path, target(load_timeout='"soon"')))


@pytest.mark.parametrize(("url", "prefix", "want"), [
    ("http://127.0.0.1:30000", "", reach.Endpoint("http", "127.0.0.1", 30000, "", "127.0.0.1:30000")),
    ("https://gpu-1.internal/base/", "", reach.Endpoint("https", "gpu-1.internal", 443, "/base", "gpu-1.internal")),
    ("http://[::1]:8000/a b", "", reach.Endpoint("http", "::1", 8000, "/a%20b", "[::1]:8000")),
    ("http://localhost", "", reach.Endpoint("http", "localhost", 80, "", "localhost")),
    ("unix:/run/vllm/api.sock", "/p/", reach.Endpoint("unix", "localhost", 0, "/p", "localhost",
                                                        "/run/vllm/api.sock")),
], ids=["ip-port", "https-default-port", "ipv6-path", "default-port", "unix"])
def test_a_target_url_is_parsed_once_into_an_endpoint(url: str, prefix: str, want: reach.Endpoint) -> None:
    table = {"unit": "t.service", "url": url, **({"path_prefix": prefix} if prefix else {})}
    t = config.parse({"targets": {"t": table}}).targets["t"]
    assert t.endpoint == want
    assert replace(t, url="http://127.0.0.1:1", path_prefix="").endpoint.port == 1  # derived anew, never stale


def test_one_tls_context_per_target_shared_by_every_probe_and_the_bench_client(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from genready.probe.probe import Prober
    from genready.tools import benchclient

    built: list[str] = []
    real = reach.client_context

    def counting(*args: Any) -> Any:
        built.append(args[0])
        return real(*args)

    monkeypatch.setattr(reach, "client_context", counting)
    path = materialize(tmp_path, TARGET.replace("http://", "https://") + "tls_verify = false\n")
    t = config.load(path).targets["sglang"]
    assert built == [""]  # at load: a bad PEM file is a config error
    probers = [Prober(t) for _ in range(3)]  # e.g. one per reload
    assert t.tls_context is not None and all(p._ssl is t.tls_context for p in probers) and len(built) == 1
    # The bench client (its own process) reads the config, which builds the context: nothing more.
    args = benchclient.build_parser().parse_args(["--config", str(path)])
    _, ctx = benchclient.settings(args, {})
    assert ctx is not None and len(built) == 2
    assert args.url == "https://127.0.0.1:30000"


def test_the_only_target_is_the_one_named_else_the_only_one_configured() -> None:
    def cfg(*names: str) -> config.Config:
        return config.parse({"targets": {n: {"unit": f"{n}.service", "url": "http://127.0.0.1:9"} for n in names}})

    assert cfg("a").only_target() == "a"
    assert cfg("a").only_target("b") == "b"  # named: as named (whether it exists is the caller's check)
    assert cfg("a", "b").only_target() is None
    assert cfg("a", "b").only_target("b") == "b"
