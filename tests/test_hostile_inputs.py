"""Hostile input from what genready reads and shows: a server's or a unit's output (secrets, escape
sequences), the onboarding writer (`init --write`), the sweep's drop-in header, report and dataset
files that are no regular file or no JSON.

In-process where the surface is a function; the CLI where the surface is what a person runs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from genready import config
from genready.apis import EXCERPT_CHARS
from genready.config import TargetConfig
from genready.probe.probe import Prober
from genready.redact import MASK, escape, redact, redact_lines
from genready.serve import page
from genready.vocab import Failure, ProbeResult
from genready_dev.hostile import raw_server
from genready_dev.usermanager import UserManager

# --- secrets in a failed start's lines ----------------------------------------------------------

# Real start-up lines, as the servers' own logging calls print them.
REAL_LINES = [
    # vLLM, vllm/entrypoints/openai/cli_args.py (0.9.x): logger.info("non-default args: %s", non_default_args);
    # api_key is a list (nargs="+") there; vllm/entrypoints/utils.py log_non_default_args (newer) masks
    # api_key and vault_token itself, but not hf_token.
    ("INFO 08-06 21:23:02 [cli_args.py:309] non-default args: {'port': 8011, 'model': '/models/m', "
     "'api_key': ['sk-vllm-list-1', 'sk-vllm-list-2'], 'hf_token': 'hf_vllmtoken3', 'tensor_parallel_size': 2}",
     ["sk-vllm-list-1", "sk-vllm-list-2", "hf_vllmtoken3"], ["'port': 8011", "'model': '/models/m'",
                                                             "'tensor_parallel_size': 2"]),
    # vLLM, vllm/entrypoints/openai/api_server.py (older): logger.info("args: %s", args), an argparse Namespace.
    ("INFO 05-02 10:11:12 api_server.py:712] args: Namespace(host=None, port=8000, uds=None, "
     "api_key=['sk-ns-4'], ssl_keyfile='/etc/tls/key.pem', max_num_seqs=10)",
     ["sk-ns-4"], ["ssl_keyfile='/etc/tls/key.pem'", "max_num_seqs=10", "port=8000"]),
    # SGLang, python/sglang/srt/entrypoints/engine.py: logger.info(f"server_args={server_args.resolved_dict()}");
    # field names from python/sglang/srt/server_args.py (api_key, admin_api_key, ssl_keyfile_password).
    ("[2026-12-03 07:00:01] server_args={'model_path': 'qwen', 'tokenizer_path': 'qwen', 'ssl_keyfile': None, "
     "'ssl_keyfile_password': 'kpw-5', 'api_key': 'sk-sgl-6', 'admin_api_key': 'sk-adm-7', "
     "'max_total_tokens': 4096, 'skip_tokenizer_init': False}",
     ["kpw-5", "sk-sgl-6", "sk-adm-7"], ["'ssl_keyfile': None", "'max_total_tokens': 4096",
                                         "'skip_tokenizer_init': False"]),
    # SGLang, the same call in older releases: the dataclass repr.
    ("[2025-03-01 07:00:01] server_args=ServerArgs(model_path='qwen', api_key='sk-sgl-8', admin_api_key=None, "
     "port=30000)", ["sk-sgl-8"], ["admin_api_key=None", "port=30000", "model_path='qwen'"]),
]

# The shapes secrets come in beyond those (argparse errors, URLs, headers, reprs, the environment),
# each with what must stay readable around it.
SHAPE_LINES = [
    ("Namespace(api_key=['sk-a', 'sk-second'])", ["sk-a", "sk-second"], ["Namespace(api_key="]),
    ("sglang: error: unrecognized arguments: --admin-api-key sk-admin-1 --bogus", ["sk-admin-1"], ["--bogus"]),
    ("vllm serve m --hf-token hf_abc123 --port 8000", ["hf_abc123"], ["--port 8000"]),
    ("proxy https://user:pass@host.example/x", ["user:pass", "pass@"], ["https://", "@host.example/x"]),
    ("Authorization: Basic dXNlcjpwYXNz", ["dXNlcjpwYXNz"], ["Authorization: Basic"]),
    ("ssl_keyfile_password='pw-1'", ["pw-1"], []),
    ("{'token': 'tk-1', 'password': 'pw-2'}", ["tk-1", "pw-2"], []),
    ("api_key=SecretStr('sk-secret-str')", ["sk-secret-str"], []),
    ("AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI", ["wJalrXUtnFEMI"], ["AWS_SECRET_ACCESS_KEY="]),
    ("HF_TOKEN hf_spaced", ["hf_spaced"], ["HF_TOKEN"]),
    ("Authorization: Token tok-1", ["tok-1"], ["Token"]),
    ("headers {'authorization': 'Digest username=\"u\", response=\"r1\"'}", ['response="r1"'], ["Digest"]),
    ("argv ['sglang', '--api-key', 'sk-argv', '--port', '1']", ["sk-argv"], ["'--port', '1'"]),
    ("usage: [--api-key API_KEY] [--port PORT]", ["API_KEY]"], ["[--port PORT]"]),
    ("--ssl-keyfile-password=kp --api-key-file /etc/genready/key", ["kp "], ["--api-key-file /etc/genready/key"]),
]


IDS = [f"real{i}" for i in range(len(REAL_LINES))] + [f"shape{i}" for i in range(len(SHAPE_LINES))]


@pytest.mark.parametrize(("line", "secrets", "kept"), REAL_LINES + SHAPE_LINES, ids=IDS)
def test_no_secret_survives_and_the_rest_stays_readable(line: str, secrets: list[str], kept: list[str]) -> None:
    out = redact(line)
    for s in secrets:
        assert s not in out, (s, out)
    for k in kept:
        assert k in out, (k, out)
    assert MASK in out


def test_a_flag_that_ends_a_line_masks_the_next_line() -> None:
    lines = ["+ exec python -m sglang.launch_server --model m --api-key", "sk-on-the-next-line --port 30000",
             "next line untouched"]
    out = redact_lines(lines)
    assert len(out) == 3 and "sk-on-the-next-line" not in "\n".join(out)
    assert out[1] == f"{MASK} --port 30000" and out[2] == "next line untouched"


def test_redaction_is_one_table_of_rules() -> None:
    from genready import redact as mod

    assert len(mod.RULES) >= 6 and all(r.why for r in mod.RULES)
    # Idempotent: a redacted line redacts to itself (records are redacted again when read).
    for line, _, _ in REAL_LINES + SHAPE_LINES:
        once = redact(line)
        assert redact(once) == once


@pytest.mark.parametrize("text", ["secret" * 10_000, "api_key=1, " * 6_000, "HF_TOKEN " * 7_000, "password" * 8_000,
                                  "--api-key " + "w " * 30_000, "api_key='x " * 6_000, "--api-key\n" * 6_000],
                         ids=["word", "names", "env", "word2", "flagwords", "quotes", "lines"])
def test_redaction_stays_linear_on_hostile_lines(text: str) -> None:
    """A server's line can be long and repetitive: no shape of it may cost quadratic time (the first
    version of the table took 40 s on 64 KiB of `api_key=1, `)."""
    import time

    t0 = time.monotonic()
    redact(text)
    assert time.monotonic() - t0 < 3.0


# --- escape sequences ---------------------------------------------------------------------------

HOSTILE = "osc52 \x1b]52;c;cHduZWQ=\x07 title \x1b]0;pwned\x07 clear \x1b[2J up \x1b[1A\x1b[2K c1 \x9b2J del \x7f"


def test_escape_leaves_no_control_character() -> None:
    out = escape(HOSTILE + "\u2028\u202e\r\n\t")
    assert not any((0 <= ord(c) < 0x20 and c != "\t") or 0x7F <= ord(c) < 0xA0 for c in out)
    assert "\\x1b]52;c;" in out and "\\x9b" in out and "\\x7f" in out and "\\u2028" in out and "\\u202e" in out
    assert "\t" in out and escape("plain ünïcödé 字\t") == "plain ünïcödé 字\t"


class _Canned:
    """A loopback HTTP server (a thread) answering every GET with one status and JSON body: the daemon's
    API as a hostile local process on its port, or a daemon relaying a hostile server, would answer."""

    def __init__(self, status: int, body: object) -> None:
        import http.server
        import json
        import threading

        payload = json.dumps(body).encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        # A 20 ms poll: shutdown() waits for the loop to see it (0.5 s by default, in every test here).
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _hostile_target() -> dict[str, object]:
    return {"target": "t", "unit": "t.service", "state": "rejected", "ready": False, "pid": 42,
            "reason": "rejected: " + HOSTILE, "last_error": "bad_status: HTTP 500 " + HOSTILE, "probes": 3,
            "records": [{"invocation_id": "ab" * 16, "main_pid": 42, "result": "exit-code" + HOSTILE}],
            "warnings": ["w " + HOSTILE], "config_changes": [HOSTILE],
            "last_failure": {"invocation_id": "cd" * 16, "main_pid": 41, "result": "exit-code", "exit_code": "exited",
                             "exit_status": 1, "ended_at": "2026-12-03T07:00:00+00:00",
                             "journal": ["line " + HOSTILE, "\x1b[1A\x1b[2Kerased row"]}}


def _no_controls(text: str) -> None:
    bad = [c for c in text if (ord(c) < 0x20 and c not in "\t\n") or 0x7F <= ord(c) < 0xA0]
    assert not bad, (bad[:5], text[:400])


@pytest.mark.parametrize("tty", [False, True])
def test_genready_status_escapes_what_servers_wrote(tty: bool, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from genready import cli

    srv = _Canned(200, {"version": "x", "uptime_seconds": 1, "bus": "user", "bus_connected": True,
                        "owner_proof": "full", "config_error": "bad " + HOSTILE, "restart_needed": [HOSTILE],
                        "targets": {"t": _hostile_target()}})
    monkeypatch.setattr("sys.stdout.isatty", lambda: tty)
    try:
        assert cli.main(["status", "--url", srv.url]) == 0
    finally:
        srv.close()
    out = capsys.readouterr().out
    _no_controls(out)
    assert "\\x1b]52;c;" in out and "erased row" in out and "\\x1b[1A\\x1b[2K" in out


@pytest.mark.parametrize("command", ["wait"])
def test_wait_prints_a_servers_words_escaped(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    from genready import cli

    srv = _Canned(503, _hostile_target())
    try:
        rc = cli.main([command, "t", "--url", srv.url, "--timeout", "0"])
    finally:
        srv.close()
    err = capsys.readouterr().err
    assert rc != 0 and "t: not ready: rejected" in err
    _no_controls(err)
    assert "\\x1b]0;pwned\\x07" in err


def test_live_lines_escape_a_probes_error() -> None:
    import io

    from genready.client.progress import LiveLines

    for tty in (True, False):
        buf = io.StringIO()
        LiveLines(buf, tty=tty).show([_hostile_target() | {"last_error": None},
                                      _hostile_target() | {"state": "loading", "last_error": HOSTILE + ": x"}])
        shown = buf.getvalue()
        # The live lines' own redraw sequences are the only ESCs: ESC[…F / ESC[K / ESC[J.
        assert "\x1b]" not in shown and "\x1b[2J" not in shown and "\x07" not in shown, shown


def test_the_daemon_log_has_no_raw_control_character() -> None:
    import io
    import logging

    from genready import log

    for journal in (True, False):
        buf = io.StringIO()
        log.setup("info", journal=journal, stream=buf)
        logger = logging.getLogger("genready.test")
        log.event(logger, logging.WARNING, "t: probe failed " + HOSTILE, detail="HTTP 500 " + HOSTILE)
        logger.warning("plain %s", "reason\n<3>forged line " + HOSTILE)
        text = buf.getvalue()
        _no_controls(text)
        assert text.count("\n") == 2 and "\\x1b[2J" in text, text


def test_status_line_uses_the_same_escape() -> None:
    from genready.systemd.notify import one_line

    assert one_line("a\x1b[2Jb\nc") == "a\\x1b[2Jb; c" == escape("a\x1b[2Jb") + "; c"


# --- the sweep drop-in's header -----------------------------------------------------------------

@pytest.mark.parametrize(("plan", "results"), [
    ("bench\n[Service]\nExecStartPre=touch PWNED\n#.toml", "/srv/r"),
    ("plan.toml", "/srv/r\n[Service]\nExecStartPre=touch PWNED\n#"),
    ("p\rq\x85r\u2028s\x7f.toml", "/srv/r\x0b\x0c"),
    ("ends-in-backslash\\", "/srv/r\\"),
])
def test_no_name_escapes_the_dropin_header(plan: str, results: str) -> None:
    from genready.systemd.sweepdropin import owner_header, owner_of

    head = owner_header(plan, Path(results), "2026-12-03T07:00:00+00:00")
    lines = head.split("\n")
    assert lines[-1] == "" and len(lines) == 4, head
    for line in lines[:-1]:
        assert line.startswith("#") and not line.endswith("\\"), line  # a comment, and not continued
        assert all(0x20 <= ord(c) < 0x7F for c in line), line
    owner = owner_of(head + "[Service]\nEnvironment=A=1\n")
    assert owner is not None and owner["plan"].endswith(plan) and owner["results"].endswith(results)


# --- api_key_credential outside the service -----------------------------------------------------

CRED_CONFIG = ('[targets.llama]\nunit = "llama.service"\nurl = "http://127.0.0.1:8080"\n'
               'api = "openai-completions"\napi_key_credential = "{name}"\n')


def test_check_config_checks_a_credential_as_far_as_it_can(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from genready import cli, config

    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    path = tmp_path / "genready.toml"
    path.write_text(CRED_CONFIG.format(name="apikey"))
    assert cli.main(["check-config", "--config", str(path)]) == 0
    err = capsys.readouterr().err
    assert "targets.llama: api_key_credential = 'apikey'" in err and "only genready.service can check" in err
    # What can be checked here still is: a name systemd would refuse.
    path.write_text(CRED_CONFIG.format(name="../etc/shadow"))
    with pytest.raises(SystemExit) as e:
        cli.main(["check-config", "--config", str(path)])
    assert e.value.code == 78
    # The service itself (serve) still needs it now, as before.
    path.write_text(CRED_CONFIG.format(name="apikey"))
    with pytest.raises(config.ConfigError, match=r"CREDENTIALS_DIRECTORY"):
        config.load(path)
    # ... and where $CREDENTIALS_DIRECTORY is set (check-config inside the service), it is read.
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    with pytest.raises(config.ConfigError, match="apikey"):
        config.load(path, service=False)
    (tmp_path / "apikey").write_text("sk-1\n")
    assert config.load(path, service=False).targets["llama"].api_key == "sk-1"


def test_init_write_takes_the_table_it_proposes_for_a_credential(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from genready.tools import unitinit

    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    prop = unitinit.target_from_exec("llama.service", ["llama-server", "-m", "m.gguf", "--api-key-file",
                                                       "${CREDENTIALS_DIRECTORY}/apikey"], {})
    assert prop.table["api_key_credential"] == "apikey"
    path = tmp_path / "genready.toml"
    unitinit.append_table(str(path), "llama", unitinit.render("llama", prop))
    assert 'api_key_credential = "apikey"' in path.read_text()


# --- unbounded and non-regular files ---------------------------------------------------------

def _bounded(fn: Callable[[], object], seconds: float = 10.0) -> object:
    """fn()'s result or exception, or a failure if it does not return within `seconds` (a FIFO read hangs)."""
    import threading

    out: list[object] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as e:
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert out, f"still running after {seconds} s"
    return out[0]


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    import os

    p = tmp_path / "fifo"
    os.mkfifo(p)
    return p


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "dir"])
def test_init_write_refuses_a_config_that_is_no_regular_file(kind: str, fifo: Path, tmp_path: Path) -> None:
    from genready.tools import unitinit

    path = {"fifo": str(fifo), "/dev/zero": "/dev/zero", "dir": str(tmp_path)}[kind]
    block = '[targets.x]\nunit = "x.service"\nurl = "http://127.0.0.1:1"\n'
    got = _bounded(lambda: unitinit.append_table(path, "x", block))
    assert isinstance(got, unitinit.WriteRefused), got
    assert str(got).startswith(f"{path}: expected a regular file of at most 1 MiB, found a"), got


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero"])
def test_init_does_not_hang_on_an_environment_file(kind: str, fifo: Path) -> None:
    from genready.systemd import unitexec

    path = str(fifo) if kind == "fifo" else kind
    got = _bounded(lambda: unitexec._env_file(path))
    assert isinstance(got, tuple), got
    env, note = got
    assert env == {} and note.startswith(f"EnvironmentFile={path}: expected a regular file"), note


# --- init: text from ExecStart= stays in its comment --------------------------------------------

def test_a_line_break_in_an_execstart_argument_stays_in_its_comment() -> None:
    from genready.compat import tomllib
    from genready.tools import unitinit

    # ExecStart=docker run … --uds "/run/v\n[targets.other]\nverify_owner = false\n#": systemd's C escape.
    evil = "/run/v.sock\n[targets.other]\nverify_owner = false\n#"
    prop = unitinit.target_from_exec("vllm.service", ["docker", "run", "--name", "v", "vllm/vllm-openai:latest",
                                                      "--uds", evil, "--served-model-name", 'a"b\nc = 1'], {})
    block = unitinit.render("vllm", prop)
    doc = tomllib.loads(block)
    assert list(doc["targets"]) == ["vllm"] and "verify_owner" not in doc["targets"]["vllm"], block
    assert doc["targets"]["vllm"]["model"] == 'a"b\nc = 1'  # a value: through tomli-w, whole
    comments = [line for line in block.splitlines() if line.startswith("#")]
    assert any("/run/v.sock\\x0a[targets.other]" in c for c in comments), comments
    assert not any(line.startswith(("[targets.other]", "verify_owner")) for line in block.splitlines())
    template = unitinit.template("x.service", 'we"ird')
    assert all(line.startswith("#") for line in template.splitlines())


# --- init messages --------------------------------------------------------------------------------

def test_an_unrecognised_command_is_shown_without_its_secrets() -> None:
    from genready.tools import unitinit

    argv = ["/opt/srv/bin/serve", "--hf-token", "hf_leak1", "--admin-api-key", "sk-leak2", "--token", "tk-leak3",
            "--password", "pw-leak4", "--listen", "0.0.0.0:1"]
    with pytest.raises(unitinit.Unrecognised) as e:
        unitinit.target_from_exec("srv.service", argv, {})
    text = str(e.value)
    assert not any(s in text for s in ("hf_leak1", "sk-leak2", "tk-leak3", "pw-leak4")), text
    assert "--listen 0.0.0.0:1" in text and "--hf-token ***" in text


def test_the_key_exposure_warning_only_where_it_is_true(tmp_path: Path) -> None:
    import os

    from genready.tools import unitinit

    argv = ["vllm", "serve", "m"]
    private, public = tmp_path / "private.env", tmp_path / "public.env"
    for f, mode in ((private, 0o600), (public, 0o644)):
        f.write_text("VLLM_API_KEY=sk-1\n")
        os.chmod(f, mode)
    env = {"VLLM_API_KEY": "sk-1"}
    quiet = unitinit.target_from_exec("v.service", argv, env, {"VLLM_API_KEY": str(private)})
    assert quiet.warnings == [] and any("api_key_file" in c for c in quiet.comments)
    loud = unitinit.target_from_exec("v.service", argv, env, {"VLLM_API_KEY": str(public)})
    assert len(loud.warnings) == 1 and f"EnvironmentFile={public}" in loud.warnings[0] and "0644" in loud.warnings[0]
    shown = unitinit.target_from_exec("v.service", argv, env)
    assert "systemctl show" in shown.warnings[0]
    cmdline = unitinit.target_from_exec("v.service", ["env", "VLLM_API_KEY=sk-2", *argv], {})
    assert "/proc/PID/cmdline" in cmdline.warnings[0]
    assert not any("sk-1" in w or "sk-2" in w for p in (loud, shown, cmdline) for w in p.warnings)


# --- sweep report ---------------------------------------------------------------------------

def _results_folder(root: Path) -> Path:
    """A results folder as a careless or hostile host leaves it: every kind of bad line and bench file."""
    import json
    import os

    d = root / "r"
    d.mkdir()
    lines: list[str] = []

    def point(i: int, bench: object = None, **fields: object) -> None:
        out = f"{i}-p"
        rec = {"index": i, "point": {"n": i}, "status": "ok", "attempt": 1, "pid": 100 + i, "load_seconds": 1.5,
               "run_seconds": 2.0, "out": out, **fields}
        lines.append(json.dumps(rec))
        folder = d / out
        folder.mkdir(exist_ok=True)
        if isinstance(bench, dict):
            (folder / "bench.jsonl").write_text(json.dumps(bench) + "\n")  # json writes NaN/Infinity as is
        elif bench == "dir":
            (folder / "bench.jsonl").mkdir()
        elif bench == "loop":
            os.symlink("bench.jsonl", folder / "bench.jsonl")
        elif bench == "fifo":
            os.mkfifo(folder / "bench.jsonl")
        elif bench == "zero":
            os.symlink("/dev/zero", folder / "bench.jsonl")

    fig = {"accept_length": 2.0, "output_tokens_per_second": 100.0, "ttft_p50_ms": 50.0, "itl_p50_ms": 5.0}
    point(1, fig)
    point(2, "dir")
    point(3, fig, load_seconds="12")
    point(4, fig, load_seconds=[1])
    point(5, fig, out="5-p\x00x")
    point(6, "loop")
    point(7, "fifo")
    point(8, "zero")
    point(9, fig | {"output_tokens_per_second": float("inf")})
    point(10, fig | {"output_tokens_per_second": float("nan"), "ttft_p50_ms": float("-inf")})
    lines.append('{"index": 11, "point": {"n": 11}, "status": "ok", torn')
    point(12, fig | {"output_tokens_per_second": 90.0}, status="=1+2", host="\x1b]0;pwned\x07h1")
    point(13, fig | {"output_tokens_per_second": 80.0}, host="-2+3+cmd|' /C calc'!A0")
    (d / "results.jsonl").write_text("\n".join(lines) + "\n")
    return d


def _report(folder: Path, fmt: str, capsys: pytest.CaptureFixture[str]) -> tuple[object, str, str]:
    from genready import cli

    got = _bounded(lambda: cli.main(["sweep", "report", str(folder), "--format", fmt]))
    captured = capsys.readouterr()
    return got, captured.out, captured.err


def test_sweep_report_survives_every_bad_line_and_file(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    d = _results_folder(tmp_path)
    rc, out, err = _report(d, "table", capsys)
    assert rc == 0, (rc, err)
    _no_controls(out)
    _no_controls(err)
    rows = {line.split()[0]: line for line in out.splitlines()[1:] if line.startswith("n=")}
    for n in (3, 4, 5):
        assert rows[f"n={n}"].split()[1] == "unreadable", rows[f"n={n}"]
    for n in (2, 6, 7, 8):
        assert rows[f"n={n}"].split()[1] == "ok" and "unreadable" in rows[f"n={n}"], rows[f"n={n}"]
    assert f"{d}/results.jsonl:11: skipping a line that is not a JSON object" in err
    assert f"{d}/results.jsonl:3: load_seconds: expected a number, found str" in err
    assert f"{d}/results.jsonl:4: load_seconds: expected a number, found list" in err
    assert f"{d}/results.jsonl:5: out: expected a folder name" in err
    assert f"{d}/2-p/bench.jsonl: expected a regular file of at most 64 MiB, found a directory" in err
    assert f"{d}/7-p/bench.jsonl: expected a regular file of at most 64 MiB, found a FIFO" in err
    assert f"{d}/8-p/bench.jsonl: expected a regular file of at most 64 MiB, found a character device" in err
    assert f"{d}/6-p/bench.jsonl: cannot read it: Too many levels of symbolic links" in err
    assert "\\x1b]0;pwned\\x07h1" in out


def test_strict_json_and_non_finite_never_best(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    def no_constants(name: str) -> object:
        raise AssertionError(f"non-standard JSON constant {name}")

    rc, out, _ = _report(_results_folder(tmp_path), "json", capsys)
    assert rc == 0
    rows = {r["point"]: r for r in json.loads(out, parse_constant=no_constants)["rows"]}
    assert rows["n=9"]["output_tokens_per_second"] is None and rows["n=10"]["ttft_p50_ms"] is None
    assert "output_tokens_per_second" in rows["n=1"]["best"]  # 100 beats 90 and 80; inf is not a value
    assert "ttft_p50_ms" not in rows["n=10"]["best"]  # -inf is not the best latency
    assert "output_tokens_per_second" not in rows["n=9"]["best"] + rows["n=10"]["best"]


def test_csv_cells_a_spreadsheet_would_run_are_quoted(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    import csv
    import io

    rc, out, _ = _report(_results_folder(tmp_path), "csv", capsys)
    assert rc == 0
    cells = [c for row in csv.reader(io.StringIO(out)) for c in row]
    assert "'=1+2" in cells and "'-2+3+cmd|' /C calc'!A0" in cells
    assert not any(c[:1] in "=+@" for c in cells)
    assert not any(c.startswith("-") and not c[1:2].isdigit() for c in cells if c != "-")


@pytest.mark.parametrize("kind", ["fifo", "zero", "dir"])
def test_a_results_file_that_is_no_regular_file_is_exit_65(kind: str, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    import os

    d = tmp_path / "r"
    d.mkdir()
    path = d / "results.jsonl"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero":
        os.symlink("/dev/zero", path)
    else:
        path.mkdir()
    got, _, err = _report(d, "table", capsys)
    assert isinstance(got, SystemExit) and got.code == 65, (got, err)
    assert f"{d}/results.jsonl: expected a regular file" in err


# --- bench client --dataset ----------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "deep-array", "deep-lines", "dir"])
def test_a_dataset_it_cannot_read_is_exit_65_with_a_clear_error(kind: str, fifo: Path, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from genready.tools import benchclient

    path = {"fifo": str(fifo), "/dev/zero": "/dev/zero", "dir": str(tmp_path)}.get(kind, str(tmp_path / "d.json"))
    if kind == "deep-array":
        Path(path).write_text("[" * 200_000)
    elif kind == "deep-lines":
        Path(path).write_text('{"prompt": "ok"}\n{"prompt": ' + "[" * 200_000 + "\n")
    got = _bounded(lambda: benchclient.main(["--url", "http://127.0.0.1:1", "--dataset", path, "-n", "1"]))
    err = capsys.readouterr().err
    assert isinstance(got, SystemExit) and got.code == 65, (got, err)
    says = {"fifo": f"{path}: cannot use it as the dataset: expected a regular file of at most 1 GiB, found a FIFO",
            "/dev/zero": f"{path}: cannot use it as the dataset: expected a regular file of at most 1 GiB, found a "
                         "character device",
            "dir": f"{path}: cannot use it as the dataset: expected a regular file of at most 1 GiB, found a directory",
            "deep-array": f"{path}:1: JSON nested too deeply to read",
            "deep-lines": f"{path}:2: JSON nested too deeply to read"}[kind]
    assert says in err and "Traceback" not in err, err


def test_the_other_files_genready_reads_are_bounded_too(tmp_path: Path) -> None:
    """The sweep drop-in (the daemon's leftover check, sweep, sweep restore) and the running stamp
    (check-config) go through the same reader: a FIFO planted there is named, never waited on."""
    import os

    from genready.serve import stamp
    from genready.systemd import sweepdropin

    dropin = tmp_path / sweepdropin.DROPIN_NAME
    os.mkfifo(dropin)
    got = _bounded(lambda: sweepdropin.leftover([str(dropin)]))
    assert isinstance(got, sweepdropin.Leftover) and got.owner is None, got
    os.mkfifo(tmp_path / stamp.RUNNING_FILE)
    assert _bounded(lambda: stamp.read_running(tmp_path)) is None


# --- the same, end to end: `genready init` on a real unit of the private user manager -------------

def test_init_on_a_hostile_unit_end_to_end(manager: UserManager, tmp_path: Path, fifo: Path) -> None:
    import os
    import subprocess

    from genready.compat import tomllib
    from genready_dev.harness import GENREADY

    env_file = tmp_path / "vllm.env"
    env_file.write_text("VLLM_API_KEY=sk-in-a-root-only-file\n")
    os.chmod(env_file, 0o600)
    # systemd C-unescapes the quoted word: the server gets a real line break in its --uds path.
    manager.install_unit("h30-vllm.service", f"""[Service]
EnvironmentFile={env_file}
EnvironmentFile=-{fifo}
ExecStart=/usr/bin/docker run --name v --env-file /etc/v.env vllm/vllm-openai:latest \\
    --uds "/run/v.sock\\n[targets.other]\\nverify_owner = false\\n#" --hf-token hf_leaked_token
""")
    try:
        def init(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([*GENREADY, "init", "h30-vllm", "--bus", "user", "--name", "v", *args],
                                  capture_output=True, text=True, env={**os.environ, **manager.env}, timeout=60)

        done = init()
        assert done.returncode == 0, done.stderr
        doc = tomllib.loads(done.stdout)
        assert list(doc["targets"]) == ["v"] and "verify_owner" not in doc["targets"]["v"], done.stdout
        assert "\\x0a[targets.other]" in done.stdout
        assert f"EnvironmentFile={fifo}: expected a regular file" in done.stderr  # named, not waited on
        assert "systemctl show" not in done.stderr and "every local user" not in done.stderr, done.stderr
        assert "hf_leaked_token" not in done.stdout + done.stderr and "sk-in-a-root" not in done.stdout + done.stderr
        done = init("--write", "--config", str(fifo))
        assert done.returncode == 78
        assert f"{fifo}: expected a regular file of at most 1 MiB, found a FIFO" in done.stderr
    finally:
        manager.remove_unit("h30-vllm.service")


def test_a_failed_starts_lines_reach_no_surface_raw(manager: UserManager, tmp_path: Path) -> None:
    """A real unit prints SGLang's and vLLM's start-up lines with keys in them and escape sequences,
    then fails: /status, `genready status` (piped) and the daemon's log show neither."""
    import json
    import os
    import subprocess

    from genready_dev.harness import GENREADY, Genready, free_port, wait_for

    out = tmp_path / "srv.out"
    lines = [line for line, _, _ in REAL_LINES] + ["Authorization: Basic dXNlcjpwYXNz", "HF_TOKEN hf_spaced",
                                                    "exec server --api-key", "sk-on-the-next-line", HOSTILE]
    data = tmp_path / "lines.txt"
    data.write_text("\n".join(lines) + "\n")
    script = tmp_path / "srv.sh"
    script.write_text(f"#!/bin/sh\ncat {data} >&2\nexit 3\n")
    script.chmod(0o755)
    unit = "h30-leaky.service"
    manager.install_unit(unit, f"[Service]\nExecStart={script}\nStandardOutput=append:{out}\n"
                               f"StandardError=append:{out}\n")
    secrets = [s for _, ss, _ in REAL_LINES for s in ss] + ["dXNlcjpwYXNz", "hf_spaced", "sk-on-the-next-line"]
    g = Genready(manager, tmp_path, {"q": {"unit": unit, "url": f"http://127.0.0.1:{free_port()}",
                                           "verify_owner": False, "backoff_initial": 0.05}})
    try:
        with g:
            manager.systemctl("start", unit, check=False)
            f = wait_for(lambda: (x := g.status()["targets"]["q"]["last_failure"]) and len(x["journal"]) > 5 and x,
                         15, "the failed start's lines in /status")
            body = json.dumps(g.status())
            shown = subprocess.run([*GENREADY, "status", "--url", g.base], capture_output=True, text=True,
                                   env={**os.environ, **manager.env}, timeout=30)
        log = g.log()
    finally:
        manager.remove_unit(unit)
    assert shown.returncode == 0, shown.stderr
    for s in secrets:
        assert s not in body and s not in shown.stdout and s not in log, s
    assert any("'api_key': ***" in line for line in f["journal"]), f["journal"]
    _no_controls(shown.stdout)
    assert "\\x1b]52;c;" in shown.stdout
    assert "\x1b" not in log and "\x07" not in log


def test_the_bench_client_needs_a_credential_only_for_the_target_it_sends_to(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from genready.tools import benchclient

    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    path = tmp_path / "genready.toml"
    path.write_text(CRED_CONFIG.format(name="apikey") + '[targets.open]\nunit = "o.service"\n'
                    'url = "http://127.0.0.1:1"\napi = "openai-completions"\n')
    args = benchclient.build_parser().parse_args(["--config", str(path), "--target", "open"])
    assert benchclient.settings(args, {})[0] == ""  # another target's credential is no obstacle
    args = benchclient.build_parser().parse_args(["--config", str(path), "--target", "llama"])
    with pytest.raises(SystemExit, match=r"targets.llama.api_key_credential = 'apikey'.*--api-key-file"):
        benchclient.settings(args, {})
    key = tmp_path / "key"
    key.write_text("sk-1\n")
    args = benchclient.build_parser().parse_args(["--config", str(path), "--target", "llama", "--api-key-file",
                                                  str(key)])
    assert benchclient.settings(args, {})[0] == "sk-1"


# --- model ids: cut and escaped like every other server text (issue 41 #6 and #13) ---------------

def _target(url: str, **kw: object) -> TargetConfig:
    # A short probe_timeout: a bound, should the server below ever hold a request unanswered.
    table = {"unit": "llm.service", "url": url, "api": "openai-chat", "verify_owner": False, "probe_timeout": 1, **kw}
    return config.parse({"targets": {"t": table}}).targets["t"]


async def _probe(models: list[str], **kw: object) -> tuple[ProbeResult, str]:
    """One probe against a server whose GET /v1/models lists `models` (it answers every request so)."""
    body = json.dumps({"object": "list", "data": [{"id": m} for m in models]}).encode()
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    async for url in raw_server(head + body, close=True):  # its side shut after each answer: no wait for a second
        prober = Prober(_target(url, **kw))
        try:
            return await prober.probe(os.getpid()), prober.model_note
        finally:
            await prober.close()
    raise AssertionError("no server")


async def test_a_model_id_with_a_lone_surrogate_reaches_every_surface_escaped() -> None:
    """`"m\\udc80"` in the server's JSON is a str no UTF-8 encoder takes: the page answered 500 for it.
    It enters genready escaped, so /status, the page and the CLI all show `m\\udc80` as text."""
    result, note = await _probe(["m\udc80"])
    for text in (note, result.detail):
        text.encode("utf-8")  # raised UnicodeEncodeError on the old code
    assert 'model "m\\udc80" (the only one listed)' in note
    doc = {"targets": {"t": {"target": "t", "model": note, "last_error": result.detail}}}
    page.render(doc).encode("utf-8")


async def test_model_ids_are_cut_like_other_server_text() -> None:
    """Ten ids of 90 KB made /status 1.8 MB and every /ready 503 as big: each id is cut at 200 characters."""
    ids = [f"{i}" + "x" * 90_000 for i in range(10)]
    result, note = await _probe(ids)
    assert len(note) < 11 * (EXCERPT_CHARS + 10), len(note)
    result, _ = await _probe(ids, model="nope")
    assert result.failure is Failure.REJECTED
    assert len(result.detail) < 11 * (EXCERPT_CHARS + 10) + 300, len(result.detail)
    assert "it lists 10: 0xxx" in result.detail and "…" in result.detail
