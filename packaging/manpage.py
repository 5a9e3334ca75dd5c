"""Write a command's man page from its own argparse parser: `python3 packaging/manpage.py NAME > NAME.1`.

The Debian package runs this at build time, so genready(1) is made from the very parser that
`genready --help` prints and cannot drift from it. It renders what genready's parsers use:
options, positionals, subcommands (and theirs: `sweep report`), and an "exit status:" epilog of
"  CODE  MEANING" lines.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import os
import re
import sys
from collections.abc import Callable, Iterator
from typing import NamedTuple


class Page(NamedTuple):
    module: str  # the module whose build_parser() the command runs
    prog: str  # the command's name on an installed system
    summary: str  # the NAME line
    files: tuple[tuple[str, str], ...] = ()
    see_also: str = ""


PAGES = {
    "genready": Page("genready.cli", "genready", "prove an LLM server's systemd unit ready by a real generation",
                     files=(("/etc/genready/genready.toml", "the configuration (see the comments in it)"),
                            ("/var/lib/genready/", "start records"),
                            ("/run/genready/", "ready stamps, one TARGET.ready per target"),
                            ("/usr/share/doc/genready/examples/", "example units, bench env file, sweep plan")),
                     see_also=r"\fBsystemctl\fR(1), \fBsystemd.service\fR(5), \fBgenready-bench-client\fR(1)"),
    "genready-bench-client": Page("genready.tools.benchclient", "genready-bench-client",
                                  "measure an LLM server's throughput and latency",
                                  see_also=r"\fBgenready\fR(1)"),
}


def esc(text: str) -> str:
    """Roff-escape running text: backslashes, hyphens as minus signs, non-ASCII as \\[uXXXX]."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    text = "".join(c if ord(c) < 128 else f"\\[u{ord(c):04X}]" for c in text)
    return "\n".join("\\&" + line if line.startswith((".", "'")) else line for line in text.split("\n"))


def _flat(text: str) -> str:
    return " ".join(text.split())


def _actions(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    for action in parser._actions:  # argparse has no public accessor; argparse-manpage reads it too
        if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            yield action


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """(prog, parser) of each subcommand in order, one with subcommands of its own standing for them: `genready
    sweep` is `genready sweep report`, `genready sweep restore` and the plan's run (whose prog is `genready
    sweep`). argparse writes a subcommand's prog from its parents'."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sp in action.choices.values():
                leaves = list(_subcommands(sp))
                yield from leaves or [(sp.prog, sp)]


def _option_lines(parser: argparse.ArgumentParser) -> list[str]:
    formatter = parser._get_formatter()
    out: list[str] = []
    for action in _actions(parser):
        if action.help == argparse.SUPPRESS:
            continue
        if action.option_strings:
            metavar = "" if action.nargs == 0 else formatter._format_args(action, action.dest.upper())
            term = ", ".join(rf"\fB{esc(o)}\fR" + (rf" \fI{esc(metavar)}\fR" if metavar else "")
                             for o in action.option_strings)
        else:
            term = rf"\fI{esc(formatter._metavar_formatter(action, action.dest)(1)[0])}\fR"
        out += [".TP", term, esc(_flat(formatter._expand_help(action) if action.help else ""))]
    return out


def _usage(parser: argparse.ArgumentParser) -> str:
    return esc(_flat(parser.format_usage().removeprefix("usage: ")))


def _epilog(parser: argparse.ArgumentParser) -> list[str]:
    out: list[str] = []
    for line in (parser.epilog or "").splitlines():
        m = re.match(r"^\s+(\S+)\s+(.*)$", line)
        if m:
            out += [".TP", rf"\fB{esc(m.group(1))}\fR", esc(m.group(2))]
    return out


def render(name: str, build_parser: Callable[[], argparse.ArgumentParser], version: str) -> str:
    page = PAGES[name]
    parser = build_parser()
    built, parser.prog = parser.prog, page.prog
    # SOURCE_DATE_EPOCH (set by dpkg from debian/changelog) keeps the build reproducible.
    when = datetime.datetime.fromtimestamp(int(os.environ.get("SOURCE_DATE_EPOCH", "0")), datetime.timezone.utc)
    out = [f'.TH {name.upper()} 1 "{when:%Y-%m-%d}" "{esc(page.prog)} {version}" "User Commands"',
           ".SH NAME", rf"{esc(page.prog)} \- {esc(page.summary)}",
           ".SH SYNOPSIS", _usage(parser),
           ".SH DESCRIPTION", esc(_flat(parser.description or ""))]
    options = _option_lines(parser)
    if options:
        out += [".SH OPTIONS", *options]
    subs = list(_subcommands(parser))
    if subs:
        out.append(".SH COMMANDS")
        for prog, sp in subs:
            cmd = prog.removeprefix(built + " ")
            sp.prog = f"{page.prog} {cmd}"
            out += [f'.SS "{esc(cmd)}"', _usage(sp), ".PP", esc(_flat(sp.description or "")), *_option_lines(sp)]
    epilog = _epilog(parser)
    if epilog:
        out += [".SH EXIT STATUS", *epilog]
    if page.files:
        out.append(".SH FILES")
        for path, what in page.files:
            out += [".TP", rf"\fI{esc(path)}\fR", esc(what)]
    if page.see_also:
        out += [".SH SEE ALSO", page.see_also]
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in PAGES:
        print(f"usage: manpage.py {{{','.join(PAGES)}}}", file=sys.stderr)
        return 2
    module = importlib.import_module(PAGES[argv[0]].module)
    version = importlib.import_module("genready").__version__
    sys.stdout.write(render(argv[0], module.build_parser, version))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
