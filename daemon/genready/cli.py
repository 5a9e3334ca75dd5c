"""The `genready` command line: one subcommand per job, exit codes documented in --help."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import NoReturn

import tomli_w

from genready import __version__, config

EXIT_CODES = """\
exit status:
  0   success (ready, config valid, …)
  1   timeout: the target did not become ready in time (wait, restart)
  2   usage error
  69  the genready daemon is unreachable (EX_UNAVAILABLE)
  75  not ready, or readiness changed while CMD ran (guard; EX_TEMPFAIL)
  78  invalid configuration (EX_CONFIG)
"""


def die(msg: str, *, hint: str = "", status: int = 1) -> NoReturn:
    """Print a user-facing error (and a hint on what to do about it), then exit."""
    print(f"genready: {msg}", file=sys.stderr)
    if hint:
        print(f"hint: {hint}", file=sys.stderr)
    sys.exit(status)


def load_config(path: str | None) -> config.Config:
    """The config from --config / $GENREADY_CONFIG / the default path, or exit 78 saying why."""
    try:
        return config.load(config.resolve_path(path))
    except config.ConfigError as e:
        die(str(e), hint="`genready check-config --config PATH` validates a file", status=config.EX_CONFIG)


def cmd_check_config(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    sys.stdout.write(f"# {cfg.path}: valid; effective configuration, defaults filled in\n")
    sys.stdout.write(tomli_w.dumps(cfg.to_toml_dict()))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from genready import daemon, log

    cfg = load_config(args.config)
    log.setup(args.log_level or cfg.daemon.log_level)
    try:
        return daemon.serve(cfg, args.config)
    except OSError as e:
        die(f"cannot start: {e}", hint="check daemon.listen, daemon.state_dir and daemon.runtime_dir", status=71)


def _api_base(args: argparse.Namespace) -> str:
    if getattr(args, "url", None):
        return str(args.url).rstrip("/")
    cfg = load_config(args.config)
    host = cfg.daemon.host
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1" if host == "0.0.0.0" else "::1"
    return f"http://[{host}]:{cfg.daemon.port}" if ":" in host else f"http://{host}:{cfg.daemon.port}"


def cmd_status(args: argparse.Namespace) -> int:
    from genready import client

    data = client.get_json(_api_base(args), "/status")
    if args.json:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
        return 0
    sys.stdout.write(client.format_status(data))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="genready",
        description="Ready means a real generation, served by the unit's current MainPID, succeeded.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"genready {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help, description=help, epilog=EXIT_CODES,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
        return sp

    sp = add("check-config", "validate the config and print it as TOML, defaults filled in")
    sp.add_argument("--config", metavar="PATH", help="config file (default: $GENREADY_CONFIG or "
                    f"{config.DEFAULT_PATH})")
    sp.set_defaults(func=cmd_check_config)

    config_help = f"config file (default: $GENREADY_CONFIG or {config.DEFAULT_PATH})"
    sp = add("serve", "run the daemon: watch the targets, verify starts, serve the HTTP API")
    sp.add_argument("--config", metavar="PATH", help=config_help)
    sp.add_argument("--log-level", choices=config.LOG_LEVELS, help="overrides daemon.log_level")
    sp.set_defaults(func=cmd_serve)

    sp = add("status", "show every target's state and newest start records (from the daemon's /status)")
    sp.add_argument("--config", metavar="PATH", help=config_help)
    sp.add_argument("--url", help="the daemon's API base URL (default: from the config's daemon.listen)")
    sp.add_argument("--json", action="store_true", help="print /status's JSON as it is")
    sp.set_defaults(func=cmd_status)

    from genready import sim  # the simulator owns its flags

    sp = add("simulate", "run an LLM-server simulator with SGLang's HTTP surface and its failure modes")
    sim.add_arguments(sp)
    sp.set_defaults(func=sim.main)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    rc: int = args.func(args)
    return rc


if __name__ == "__main__":
    sys.exit(main())
