"""The `genready` command line: one subcommand per job, exit codes documented in --help.

`genready wait TARGET --timeout 0` runs in units' ExecCondition=, so start-up time matters:
this module imports only what parsing needs, and each subcommand imports its own modules
(asyncio, aiohttp, pystemd, the dev tooling) when it runs. bench/cli_start.py measures it.

Each subcommand is a pair, as vLLM's `vllm/entrypoints/cli/` has them: `add_NAME` adds its parser
(COMMANDS, in --help's order) and `cmd_NAME` runs it. A run builds only its own subcommand's parser.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, Final, NoReturn

from genready import __version__, config, console, exitcodes
from genready.client import GUARD_MIN_INTERVAL, GUARD_STOP_GRACE
from genready.exitcodes import Exit

EXIT_CODES = exitcodes.help_text()
LIVE_POLL = 1.0  # seconds between redraws of the live progress lines of wait and restart


def die(msg: str, *, hint: str = "", status: int = Exit.TIMEOUT) -> NoReturn:
    """Print a user-facing error (and a hint on what to do about it), then exit."""
    console.err(f"genready: {msg}")
    if hint:
        console.err(f"hint: {hint}")
    sys.exit(status)


class Parser(argparse.ArgumentParser):
    """argparse, its usage errors (exit 2) written so that a closed stderr cannot change the status."""

    def error(self, message: str) -> NoReturn:
        console.write(self.format_usage(), sys.stderr)
        die(f"{self.prog}: {message}", status=Exit.USAGE)


class Formatter(argparse.RawDescriptionHelpFormatter):
    """argparse's help layout, its width found without shutil: argparse makes a formatter for every
    add_argument, and shutil (with bz2 and lzma) was a measurable part of `genready wait`'s start-up."""

    def __init__(self, prog: str) -> None:
        try:
            columns = int(os.environ.get("COLUMNS", "0")) or os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):  # no stdout (None), no terminal, a bad COLUMNS
            columns = 80
        super().__init__(prog, width=max(columns, 20) - 2)  # as argparse does with shutil's width


# Numeric flags: (lowest value, whether it is allowed). Parsed after argparse, so "soon", "nan",
# "inf" and "-1" are all one kind of error (64, naming the flag), never an endless or hot loop.
NUMBERS: dict[str, tuple[float, bool]] = {"timeout": (0.0, True), "since": (0.0, True), "interval": (0.0, False),
                                          "kill_after": (0.0, True)}


def check_numbers(args: argparse.Namespace) -> None:
    """Turn each numeric flag given as text into a float, or exit 64 naming the flag."""
    for dest, (lowest, inclusive) in NUMBERS.items():
        text = getattr(args, dest, None)
        if not isinstance(text, str):
            continue  # absent, or its (numeric) default
        flag = "--" + dest.replace("_", "-")
        try:
            v = float(text)
        except ValueError:
            v = math.nan
        if not math.isfinite(v) or v < lowest or (v == lowest and not inclusive):
            die(f"{flag}: expected a finite number {'>=' if inclusive else '>'} {lowest:g}, found {text!r}",
                status=Exit.BAD_ARGUMENT)
        setattr(args, dest, v)


def load_config(path: str | None, *, service: bool = False) -> config.Config:
    """The config from --config / $GENREADY_CONFIG / the default path, or exit 78 saying why.
    `service`: this is genready.service (`serve`): every api_key_credential must be readable now;
    elsewhere only its name is checked."""
    try:
        return config.load(config.resolve_path(path), service=service)
    except config.ConfigError as e:
        die(str(e), hint="`genready check-config --config PATH` validates a file", status=Exit.CONFIG)


def cmd_check_config(args: argparse.Namespace) -> int:
    import tomli_w

    from genready.serve import stamp

    cfg = load_config(args.config)
    if warning := config.listen_warning(cfg.daemon):
        console.err(f"genready: warning: {warning}")
    running = stamp.read_running(cfg.daemon.runtime_dir)
    if running and os.path.realpath(str(running.get("config"))) == os.path.realpath(cfg.path):
        # The daemon running this very file: what a reload of it would not apply.
        for why in config.restart_needed(config.as_running(cfg.daemon, running), cfg.daemon):
            console.err(f"genready: warning: {why} (the running genready is pid {running.get('pid')})")
    for t in cfg.targets.values():
        for w in t.warnings:
            console.err(f"genready: warning: targets.{t.name}: {w}")
        if note := t.credential_unchecked:
            console.err(f"genready: note: targets.{t.name}: {note}")
    if args.probe:
        import asyncio

        from genready.tools import preflight

        console.out(f"# {cfg.path}: valid; one probe per target now")
        return asyncio.run(preflight.run(cfg, sys.stdout))
    console.write(f"# {cfg.path}: valid; effective configuration, defaults filled in\n"
                  + tomli_w.dumps(cfg.to_toml_dict()), sys.stdout)
    return 0


def cmd_init(args: argparse.Namespace) -> int:
    from genready.systemd import unitexec
    from genready.tools import unitinit

    unit = args.unit if "." in args.unit else args.unit + ".service"
    if problem := config.check_unit(unit):
        die(f"{unit!r}: expected {problem}", status=Exit.USAGE)
    bus = args.bus or _configured_bus(args.config)
    try:
        info = unitexec.read(bus, unit)
    except Exception as e:  # pystemd's DBusError: no bus, or the manager refused
        die(f"cannot read {unit} from the {bus} bus: {e}", hint="--bus user for a user unit; the system bus "
            "needs a running systemd", status=Exit.UNAVAILABLE)
    if info.load_state != "loaded":
        die(f"{unit} is {info.load_state or 'unknown'} on the {bus} bus", hint="--bus user for a user unit",
            status=Exit.USAGE)
    name = args.name or unitinit.target_name(unit)
    for note in info.notes:
        console.err(f"genready: warning: {note}")
    try:
        prop = unitinit.propose(unit, info.commands, info.environment, info.env_files)
    except unitinit.Unrecognised as e:
        console.err(f"genready: {e}")
        sys.stdout.write(unitinit.template(unit, name))
        return Exit.BAD_DATA
    for w in prop.warnings:
        console.err(f"genready: warning: {w}")
    block = unitinit.render(name, prop)
    sys.stdout.write(block)
    if not args.write:
        return 0
    path = str(config.resolve_path(args.config))
    try:
        unitinit.append_table(path, name, block)
    except unitinit.WriteRefused as e:
        die(f"not written: {e}", status=Exit.CONFIG)
    console.err(f"genready: appended [targets.{name}] to {path}; check-config:")
    return cmd_check_config(argparse.Namespace(config=path, probe=False))


def _configured_bus(path: str | None) -> str:
    """The config's daemon.bus if a config loads, else "system" (init works without a config)."""
    try:
        return config.load(config.resolve_path(path), service=False).daemon.bus
    except config.ConfigError:
        return "system"


def cmd_serve(args: argparse.Namespace) -> int:
    import logging

    from genready import log
    from genready.serve import daemon

    cfg = load_config(args.config, service=True)
    log.setup(args.log_level or cfg.daemon.log_level)
    try:
        rc = daemon.serve(cfg, args.config)
    except OSError as e:
        die(f"cannot start: {e}", hint="check daemon.listen, daemon.state_dir and daemon.runtime_dir",
            status=Exit.CANNOT_START)
    # Everything is closed and logged: skip the interpreter's teardown of every module and object,
    # which took longer than the shutdown itself (SIGTERM must end genready within ~300 ms).
    logging.shutdown()
    console.write("", sys.stdout)  # flushes; a closed stream must not change the exit status
    console.write("", sys.stderr)
    os._exit(rc)


def _api_base(args: argparse.Namespace) -> str:
    if getattr(args, "url", None):
        return str(args.url).rstrip("/")
    cfg = load_config(args.config)
    host = cfg.daemon.host
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1" if host == "0.0.0.0" else "::1"
    return f"http://[{host}]:{cfg.daemon.port}" if ":" in host else f"http://{host}:{cfg.daemon.port}"


def cmd_status(args: argparse.Namespace) -> int:
    from genready.client import client
    from genready.redact import escape_tree

    data = client.get_json(_api_base(args), "/status")
    # A terminal gets the table for people; anything else keeps the long-standing text format. Every
    # string in it may come from a server or a unit's output: escaped before it is laid out.
    text = (json.dumps(data, indent=2) + "\n" if args.json else
            client.format_status_tty(escape_tree(data)) if sys.stdout.isatty()
            else client.format_status(escape_tree(data)))
    console.write(text, sys.stdout)
    return 0


def _one_target(args: argparse.Namespace, cfg: config.Config | None) -> str | None:
    """The TARGET argument, or the only configured target; None means "every target"."""
    if cfg is None:
        return str(args.target) if args.target else None
    return cfg.only_target(args.target)


def _config_if_needed(args: argparse.Namespace) -> config.Config | None:
    return None if args.url and args.target else load_config(args.config)


def wait_ready(base: str, target: str | None, timeout: float, since: float | None, *, live: bool = False,
               restart: Any = None) -> Any:
    """Long-poll /ready until ready, `timeout`, or (with `since`) a failed start systemd will not follow
    with one of its own; a waiting.Outcome. With `restart` (a callable), restart first and wait for a
    start newer than that (since= taken before systemd is asked).

    A daemon that does not answer (restarting, or not up yet) is waited for until `timeout`
    too, then exit 69: readiness is what the caller waits for, and the daemon is on its way.
    `live`: show each not-ready target's progress on stderr meanwhile (client/progress.py); the
    long-poll then comes back every LIVE_POLL seconds with the daemon's latest account.
    """
    from genready.client import client, progress, waiting

    lines = progress.LiveLines(sys.stderr) if live and timeout > 0 and sys.stderr is not None else None
    said = False

    def tick(code: int, body: Any) -> None:
        nonlocal said
        if code == 0:
            if not said:
                said = True
                console.err(f"genready: the daemon at {base} is unreachable ({body.get('reason')}); waiting for "
                            f"the daemon (up to --timeout)")
        elif lines is not None and isinstance(body, dict):
            lines.show(body.get("targets", [body]) if target is None else [body])

    poll = LIVE_POLL if lines is not None else None
    try:
        if restart is not None:
            assert target is not None
            out = waiting.restart_and_wait(restart, base, target, timeout, poll=poll, tick=tick)
        else:
            out = waiting.wait_ready(base, target, timeout, since, poll=poll, tick=tick,
                                     on_failure=waiting.OnFailure.FINAL if since is not None else
                                     waiting.OnFailure.WAIT)
    finally:
        if lines is not None:
            lines.clear()
    if out.code == 0:
        client.unreachable(base, client.Unreachable(out.unreachable))
    return out


def _print_ready(body: Any) -> None:
    for t in body.get("targets", [body]) if isinstance(body, dict) else []:
        console.out(f"{t.get('target')}: ready pid {t.get('pid')} invocation {t.get('invocation_id')}"
                    f" (loaded in {t.get('load_seconds')}s)")


def _print_not_ready(body: Any) -> None:
    for t in body.get("targets", [body]) if isinstance(body, dict) else []:
        console.err(f"genready: {t.get('target')}: not ready: {t.get('state')}: {t.get('reason') or t.get('error')}")


def _print_failed(target: str | None, out: Any) -> bool:
    """Say how the start that was waited for ended (a start_failed in the last answer); False if none."""
    from genready.client.waiting import failure_lines, start_failed

    failed = out.failed or start_failed(out.body)
    if failed is None:
        return False
    if target is None and isinstance(out.body, dict):  # every target: the one whose start failed
        target = next((t.get("target") for t in out.body.get("targets", []) if t.get("start_failed") is failed), None)
    first, *rest = failure_lines(failed)
    why = ("and systemd will not start the unit again by itself" if out.failed is not None else
           "systemd is starting the unit again" if failed.get("restarting") else "")
    if out.failed is None:
        _print_not_ready(out.body)
    pid = f"pid {failed['main_pid']}" if failed.get("main_pid") else "no main process"
    console.err(f"genready: {target}: start {str(failed.get('invocation_id'))[:12]} ({pid}) "
                f"ended before it was verified{', ' + why if why else ''}: {first}")
    for line in rest:
        console.err(line)
    return True


def cmd_wait(args: argparse.Namespace) -> int:
    cfg = _config_if_needed(args)
    target = _one_target(args, cfg)
    out = wait_ready(_api_base(args), target, args.timeout, args.since, live=True)
    if out.code == 200:
        _print_ready(out.body)
        return 0
    if out.code == 404 or out.code == 400:
        die(str(out.body.get("error")), status=Exit.USAGE)
    if not _print_failed(target, out):
        _print_not_ready(out.body)
    return Exit.TIMEOUT


def cmd_restart(args: argparse.Namespace) -> int:
    from genready.systemd import bus, control

    cfg = load_config(args.config)
    target = _one_target(args, cfg)
    if target is None or target not in cfg.targets:
        die(f"name a target to restart; configured: {', '.join(cfg.targets)}", status=Exit.USAGE)
    unit = cfg.targets[target].unit

    def restart() -> None:
        try:
            control.restart_unit(cfg.daemon.bus, unit)  # asks the bus socket first (check_bus), then restarts
        except Exception as e:
            die(f"could not restart {unit} on the {cfg.daemon.bus} bus: {bus.dbus_words(e)}",
                hint="restarting a system unit needs root or a polkit rule" if bus.denied(e) else "",
                status=Exit.TIMEOUT)
        console.err(f"{target}: restart of {unit} requested; waiting for a verified start newer than it")

    out = wait_ready(_api_base(args), target, args.timeout, None, live=True, restart=restart)
    if out.code == 200:
        _print_ready(out.body)
        return 0
    if out.code in (400, 404):
        die(f"the daemon refused: {out.body.get('error')}", hint="is the daemon running with this config?",
            status=Exit.USAGE)
    if not _print_failed(target, out):
        _print_not_ready(out.body)
    return Exit.TIMEOUT


def cmd_guard(args: argparse.Namespace) -> int:
    from genready.client import guard

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        die("guard needs a command: genready guard [TARGET] -- CMD ARGS...", status=Exit.USAGE)
    cfg = _config_if_needed(args)
    target = _one_target(args, cfg)
    if target is None:
        die("name the target to guard", status=Exit.USAGE)
    return guard.run(_api_base(args), target, cmd, interval=args.interval, grace=args.kill_after)


def cmd_sweep(args: argparse.Namespace) -> int:
    from genready.sweep import main as sweep  # lazy: only a sweep needs it

    cfg = load_config(args.config)
    return sweep.main(args, cfg, _api_base(args))


def config_flag(p: argparse.ArgumentParser) -> None:
    """--config, as every subcommand that reads the config takes it."""
    p.add_argument("--config", metavar="PATH", help=f"config file (default: $GENREADY_CONFIG or {config.DEFAULT_PATH})")


def url_flag(p: argparse.ArgumentParser) -> None:
    """--url, as every subcommand that asks the daemon takes it."""
    p.add_argument("--url", help="the daemon's API base URL (default: from the config's daemon.listen)")


def target_flags(p: argparse.ArgumentParser) -> None:
    """TARGET, --config and --url: every subcommand that asks the daemon about one target."""
    p.add_argument("target", nargs="?", metavar="TARGET", help="target name (default: the only one)")
    config_flag(p)
    url_flag(p)


Subcommands = Any  # argparse._SubParsersAction[argparse.ArgumentParser]: private, and generic only from 3.9's stubs


def command(sub: Subcommands, name: str, help: str, func: Callable[[argparse.Namespace], int] | None = None,
            **kw: Any) -> argparse.ArgumentParser:
    """The parser of subcommand `name`: its help as its description, the exit codes as its epilog."""
    sp: argparse.ArgumentParser = sub.add_parser(name, help=help, description=help, epilog=EXIT_CODES,
                                                 formatter_class=Formatter, **kw)
    if func is not None:
        sp.set_defaults(func=func)
    return sp


def add_check_config(sub: Subcommands) -> None:
    sp = command(sub, "check-config", "validate the config and print it as TOML, defaults filled in", cmd_check_config)
    config_flag(sp)
    sp.add_argument("--probe", action="store_true", help="then send one probe to each target now and print a "
                    "verdict line each (ok and the pid that served it, or the failure class and detail); exit 0 "
                    "if every target generated, else 1")


def add_init(sub: Subcommands) -> None:
    # The kinds are not named here: the parser must not import servers/kinds.py (test_layout, the CLI's start-up).
    sp = command(sub, "init", "read UNIT's ExecStart= and Environment= over D-Bus (it need not run), recognise the "
                 "LLM server it starts (one of the kinds docs/servers.md lists; also inside docker/podman run) and "
                 "print a [targets.NAME] table for it", cmd_init)
    sp.add_argument("unit", metavar="UNIT", help="the server's unit, e.g. sglang.service")
    sp.add_argument("--bus", choices=config.BUSES, help="the manager to ask (default: the config's daemon.bus, "
                    "else system)")
    sp.add_argument("--name", help="the target's name (default: the unit's name without .service)")
    sp.add_argument("--write", action="store_true", help="append the table to the config file (atomically, "
                    "comments kept; refused if the result would not load), then run check-config")
    config_flag(sp)


def add_serve(sub: Subcommands) -> None:
    sp = command(sub, "serve", "run the daemon: watch the targets, verify starts, serve the HTTP API", cmd_serve)
    config_flag(sp)
    sp.add_argument("--log-level", choices=config.LOG_LEVELS, help="overrides daemon.log_level")


def add_status(sub: Subcommands) -> None:
    sp = command(sub, "status", "show every target's state, its load against the usual, the last failed start's own "
                 "lines and the newest start records (from the daemon's /status); a table with local times on a "
                 "terminal", cmd_status)
    config_flag(sp)
    url_flag(sp)
    sp.add_argument("--json", action="store_true", help="print /status's JSON as it is")


def add_wait(sub: Subcommands) -> None:
    sp = command(sub, "wait", "wait until TARGET (or every target) is verified ready; prints the verified pid. "
                 "Meanwhile a live line per target on stderr (redrawn on a terminal, else at each change of state "
                 "and every 30 s)", cmd_wait)
    target_flags(sp)
    sp.add_argument("--timeout", default=900.0, metavar="S", help="give up after S seconds "
                    "(0: answer at once); an unreachable daemon is waited for too (then exit 69); default 900")
    sp.add_argument("--since", metavar="TS", help="only count a start that began after this Unix time; exit 1 at "
                    "once if such a start fails and systemd will not start the unit again")


def add_restart(sub: Subcommands) -> None:
    sp = command(sub, "restart", "restart TARGET's unit (D-Bus RestartUnit, your own privileges) and wait until a "
                 "start newer than the restart is verified; exit 1 at once, with how it ended and its last lines, if "
                 "that start fails and systemd will not start the unit again", cmd_restart)
    target_flags(sp)
    sp.add_argument("--timeout", default=1800.0, metavar="S", help="default 1800")


def add_guard(sub: Subcommands) -> None:
    sp = command(sub, "guard", "run CMD only while TARGET is ready; exit 75 if it was not, or if the verified "
                 "instance changed or readiness was revoked while CMD ran; otherwise CMD's exit status", cmd_guard)
    target_flags(sp)
    sp.add_argument("--interval", default=0.2, metavar="S",
                    help=f"how often to re-check readiness (default 0.2; at least {GUARD_MIN_INTERVAL:g}: smaller "
                    "values are raised to it)")
    sp.add_argument("--kill-after", default=GUARD_STOP_GRACE, metavar="S",
                    help="a signal guard gets (INT, TERM, HUP, QUIT) goes to CMD's whole process group; whatever "
                    f"is left S seconds later gets SIGKILL, as do processes CMD leaves behind "
                    f"(default {GUARD_STOP_GRACE:g})")
    # Not REMAINDER: that swallows options given after TARGET (`guard t --url U -- CMD` ran
    # "--url" as the command) and takes CMD's first word as TARGET when TARGET is omitted.
    # main() splits CMD off at the first "--"; without "--", plain words are still accepted.
    sp.add_argument("cmd", nargs="*", metavar="-- CMD ARGS")


SWEEP_HELP = ("for each point of PLAN.toml: write its runtime drop-in for TARGET's unit, restart it, wait for a "
              "verified start newer than the restart, run the command guarded, append a line to DIR/results.jsonl; "
              "at the end (or on SIGINT/SIGTERM) restore the unit's own configuration")
SWEEP_TOOLS: Final = ("report", "restore", "replay")  # words after `sweep` that name a subcommand, not a plan file
SWEEP_TOOLS_HELP = """also:
  genready sweep restore [TARGET]   remove a killed sweep's drop-in, restart the unit on its own
                                    configuration and wait until that start is verified
  genready sweep report DIR [DIR...] [--format table|csv|markdown|json|html] [--output FILE]
                                    one table of the points of one or more results folders
  genready sweep replay DIR --schedule vllm|sglang
                                    load the unit once more with the schedule DIR's results give, run
                                    each load of the sweep again into DIR/replay, and say per load how
                                    it compares with the best static configuration
"""


def add_sweep(sub: Subcommands) -> None:
    """`sweep PLAN.toml`, and its subcommands `sweep report` and `sweep restore`. A plan file may have any name, so
    the plan's run is a subcommand no one types, `run`, which main() puts in when the word after `sweep` is not
    one of SWEEP_TOOLS: `genready sweep PLAN.toml` parses as `sweep run PLAN.toml`, its --help is the run's."""
    sweep = command(sub, "sweep", SWEEP_HELP)
    tools = sweep.add_subparsers(dest="sweep_command", required=True, metavar="report|restore|replay")
    add_sweep_run(tools)
    add_sweep_report(tools)
    add_sweep_restore(tools)
    add_sweep_replay(tools)


def add_sweep_run(sub: Subcommands) -> None:
    # no help=: not listed among the sweep's subcommands (its usage is `genready sweep PLAN.toml`)
    sp: argparse.ArgumentParser = sub.add_parser("run", prog="genready sweep", description=SWEEP_HELP,
                                                 formatter_class=Formatter)
    sp.set_defaults(func=cmd_sweep)
    sp.add_argument("plan", metavar="PLAN.toml", help="the sweep plan (see docs/sweeps.md)")
    sp.add_argument("--results", metavar="DIR", required=True,
                    help="results.jsonl and one folder per point and attempt ({out}) go here")
    sp.add_argument("--resume", action="store_const", const="same", help="skip points that already have an ok "
                    "line in DIR/results.jsonl made by the same drop-in, command, target, unit and run keys; a folder "
                    "holding lines another configuration made is refused (78)")
    # One option string, not a value of --resume: `--resume PLAN.toml` must keep PLAN.toml the plan.
    sp.add_argument("--resume=rerun-changed", dest="resume", action="store_const", const="rerun-changed",
                    help="as --resume, and run again the points whose lines another configuration made")
    sp.add_argument("--dry-run", action="store_true", help="print the points, their drop-ins and commands, and "
                    "the loads and hours expected from the unit's load history; change nothing")
    sp.add_argument("--keep-config", action="store_true", help="leave the last point's drop-in in place at "
                    "the end instead of restoring the unit's own configuration")
    sp.add_argument("--restart-each", action="store_true", help="restart the unit for every point, also between "
                    "points with the same drop-in (by default such points share one verified start: one load per "
                    "server configuration)")
    sp.add_argument("--no-prune", action="store_true", help="load every configuration, also those the plan's "
                    "`prune` axes would skip after a smaller one failed to start")
    sp.add_argument("--keep-going", action="store_true", help="do not stop after the plan's max_failed_starts "
                    "starts in a row that ended before they were verified (default 3)")
    sp.add_argument("--ignore-strays", action="store_true", help="load and run next to processes of an earlier "
                    "start that hold memory on the target's GPUs, instead of waiting stray_wait for them to exit "
                    "and then stopping (exit 1)")
    sp.add_argument("--budget", metavar="DURATION", help="the sweep's time, as the plan's `budget` key (which it "
                    "replaces), e.g. 4h or 90m: no load starts that is expected, with its runs, to end past it; the "
                    "points left are recorded skipped and the sweep exits 1 (--dry-run: whether the plan fits)")
    sp.add_argument("--shard", metavar="K/N", help="run only the server configurations (groups of points with the "
                    "same drop-in) whose index is K-1 modulo N: one of N hosts; `sweep report` merges the folders")
    config_flag(sp)
    url_flag(sp)
    sp.epilog = SWEEP_TOOLS_HELP + "\n" + EXIT_CODES


def add_sweep_restore(sub: Subcommands) -> None:
    sp = command(sub, "restore", "remove the drop-in a killed sweep left on TARGET's unit, reload, restart the unit "
                 "on its own configuration and wait until that start is verified; refuses (75) while the sweep that "
                 "wrote it is still running", cmd_sweep_restore)
    target_flags(sp)
    sp.add_argument("--timeout", metavar="S", help="seconds to wait for the verified start "
                    "(default: the target's load_timeout)")


def add_sweep_replay(sub: Subcommands) -> None:
    sp = command(sub, "replay", "prove a sweep's speculation schedule in one more load: the unit loaded with the "
                 "schedule (a drop-in from the plan's, verified and confirmed by the engine's own report like any "
                 "start), each load of the sweep run again with the same command and repeats into DIR/replay, then "
                 "per load the schedule's output tok/s over the best static configuration's with its 95 %% interval; "
                 "a load below 0.90x is a regression (exit 1), and `sweep report DIR` then recommends the static "
                 "configuration", cmd_sweep_replay)
    sp.add_argument("folder", metavar="DIR", help="the sweep's --results folder (depth x concurrency, a baseline)")
    sp.add_argument("--schedule", choices=("vllm", "sglang"), required=True, help="the engine's format: the unit "
                    "runs that engine")
    sp.add_argument("--plan", metavar="PLAN.toml", help="the sweep's plan (default: the one its results name)")
    sp.add_argument("--resume", action="store_const", const="same", help="keep the loads already ok in DIR/replay")
    sp.add_argument("--dry-run", action="store_true", help="print the replay's drop-in and commands; change nothing")
    sp.add_argument("--ignore-strays", action="store_true", help="as `genready sweep --ignore-strays`")
    config_flag(sp)
    url_flag(sp)


def cmd_sweep_replay(args: argparse.Namespace) -> int:
    from genready.sweep import replay

    cfg = load_config(args.config)
    return replay.replay_main(args, cfg, _api_base(args))


def add_sweep_report(sub: Subcommands) -> None:
    from genready.sweep.report.table import FORMATS

    sp = command(sub, "report", "merge the results folders of one plan (e.g. its shards) into one table in plan "
                 "order: status, pid, load and run seconds, and the bench client's accept length, output tokens/s, "
                 "TTFT p50 and ITL p50 from {out}/bench.jsonl; the best value of each figure is marked",
                 cmd_sweep_report)
    sp.add_argument("folders", nargs="+", metavar="DIR", help="a sweep's --results folder")
    sp.add_argument("--format", choices=(*FORMATS, "html"), default="table",
                    help="html: one self-contained page with the plots (needs the genready[report] extra: matplotlib)")
    sp.add_argument("--output", metavar="FILE", help="write the report to FILE instead of stdout")
    sp.add_argument("--x", metavar="NAME", help="html: the plots' x axis (default: the client-side axis with the "
                    "most values)")
    sp.add_argument("--compare", action="store_true", help="two folders A B: the same points side by side, each "
                    "figure's change in %% of A, changes inside the noise marked ~ (table or html)")
    sp.add_argument("--lines", metavar="NAME", help="html: one line per value of this axis first (default: one per "
                    "server configuration)")
    sp.add_argument("--heatmap", metavar="X,Y", help="html, table, markdown: the speedup heatmap's two server-side "
                    "axes (default: the two with the most values)")
    sp.add_argument("--strict", action="store_true", help="exit 1 when some of the plan's points have no result "
                    "(a shard missing or unfinished)")
    sp.add_argument("--schedule", choices=("vllm", "sglang"), help="the speculation depth per concurrency from a "
                    "sweep of depth x concurrency with a baseline, in the engine's format, and the flags that carry it")


def cmd_sweep_report(args: argparse.Namespace) -> int:
    from genready.sweep.report.main import report_main  # the report's module alone: nothing a sweep's run needs

    return report_main(args.folders, args.format, output=args.output, x=args.x, lines=args.lines,
                       compare=args.compare, strict=args.strict, heatmap=args.heatmap,
                       schedule=args.schedule)


def cmd_sweep_restore(args: argparse.Namespace) -> int:
    from genready.sweep import main as sweep

    cfg = load_config(args.config)
    return sweep.restore_main(args.target, cfg, _api_base(args), args.timeout)


def add_simulate(sub: Subcommands) -> None:
    # Dev tooling (genready_dev) is imported only when its subcommand runs; main() hands
    # `simulate` its arguments untouched, so its flags live with the simulator alone.
    command(sub, "simulate", "run an LLM-server simulator with SGLang's HTTP surface and its failure modes, or "
            "with --profile NAME one server's (`genready simulate --help` lists its flags and profiles)")


def add_demo(sub: Subcommands) -> None:
    sp = command(sub, "demo", "show the restart race and genready closing it, in a private systemd user manager "
                 "(root; < 60 s; cleans up after itself)", cmd_demo)
    sp.add_argument("--fast", action="store_true", help="shorter load and linger times, for CI smoke runs")
    sp.add_argument("--keep", action="store_true", help="keep the temporary directory (units, config, logs)")
    sp.add_argument("--sweep", action="store_true", help="instead: a 2x2 `genready sweep` on the simulator, each "
                    "point benchmarked on a verified start, one start per server setting (< 60 s)")


def cmd_demo(args: argparse.Namespace) -> int:
    if args.sweep:
        return int(_dev_module("sweepdemo").run(keep=args.keep))
    return int(_dev_module("demo").main(args))


COMMANDS: Final = {"check-config": add_check_config, "init": add_init, "serve": add_serve, "status": add_status,
                   "wait": add_wait, "restart": add_restart, "guard": add_guard, "sweep": add_sweep,
                   "simulate": add_simulate, "demo": add_demo}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or with `only` (a name in COMMANDS) that subcommand's parser alone: what a run
    parses, so `genready wait` builds no other subcommand's parser (`sweep report`'s imports the report's
    formats) and imports nothing else."""
    p = Parser(
        prog="genready",
        description="Ready means a real generation, served by the unit's current MainPID, succeeded.",
        epilog=EXIT_CODES,
        formatter_class=Formatter,
    )
    p.add_argument("--version", action="version", version=f"genready {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, add in COMMANDS.items():
        if only in (None, name):
            add(sub)
    return p


def _dev_module(name: str) -> Any:
    """genready_dev.NAME, or exit saying where it is: packages (the .deb) ship the product only."""
    import importlib

    try:
        return importlib.import_module(f"genready_dev.{name}")
    except ModuleNotFoundError as e:
        if e.name not in ("genready_dev", f"genready_dev.{name}"):
            raise
        die("the simulator and the demo are development tooling (genready_dev), not installed here",
            hint="run them from a checkout: ./dev demo, or .venv/bin/genready simulate", status=Exit.USAGE)


def _split_command(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """`guard … -- CMD ARGS`: (the arguments before the first "--", CMD ARGS); CMD is None
    for every other subcommand, and for guard without "--"."""
    if argv[:1] == ["guard"] and "--" in argv:  # the only options before a subcommand are -h/--version
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, None


def main(argv: Sequence[str] | None = None) -> int:
    console.ensure_std_fds()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["simulate"]:
        sim = _dev_module("sim")
        return int(sim.cli(argv[1:]))
    try:
        if argv[:1] == ["sweep"] and (argv[1:2] or [""])[0] not in SWEEP_TOOLS:
            argv.insert(1, "run")  # `genready sweep PLAN.toml` (and its --help): add_sweep
        head, cmd = _split_command(argv)
        args = build_parser(head[0] if head and head[0] in COMMANDS else None).parse_args(head)
        check_numbers(args)
        if cmd is not None:
            args.cmd = cmd
        rc: int = args.func(args)
    except exitcodes.Failed as e:  # library modules raise; the CLI words it and picks the exit code
        die(e.msg, hint=e.hint, status=e.status)
    except KeyboardInterrupt:
        return Exit.INTERRUPTED  # the shell's convention for SIGINT; no traceback for a Ctrl-C
    return rc


if __name__ == "__main__":
    sys.exit(main())
