"""What a server's own command line sets, read as its argparse reads it: the one reader of an ExecStart= argv.

`genready init` (tools/unitinit.py: host, port, key, model, …) and the engine confirm (servers/engineconfig.py:
the engine's own keys) read the same argv for different flags; two readers had drifted apart (`--flag=value`,
repeats, nargs="+" lists, the positional; issue 49 §4). Both now take `read_argv`'s occurrences and keep what they need.

The rules, argparse's: `--flag=value` and `--flag value` are one; every occurrence is given in order, so a caller
lets the last win (or accumulates); a list flag (nargs="+") gives its first value and takes the words after it; a
flag at the end with no value sets nothing (the server refuses to start). A flag no table names takes the next
word as its value unless it is a known switch, so that a word after an unknown option is not taken for the
positional: when unsure, the positional is missed (unconfirmed, or init's other sources), never made up.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Final

# Flags whose value is a list (argparse nargs="+"): vLLM's (vllm/entrypoints/openai/cli_args.py). Only the first
# value is the one genready needs (the served name /v1/models reports first, a key that is accepted).
LISTS: Final = frozenset({"--served-model-name", "--api-key"})
# Options that take no value (store_true / BooleanOptionalAction in vLLM's and SGLang's argparse: vllm/engine/
# arg_utils.py, vllm/entrypoints/openai/cli_args.py, python/sglang/srt/server_args.py), so that the word after one
# can be the positional (`vllm serve --enforce-eager MODEL`). Not every switch: one missing here only makes the
# positional after it unread (reported unconfirmed, never taken for another value).
SWITCHES: Final = frozenset({
    "--enforce-eager", "--trust-remote-code", "--enable-prefix-caching", "--no-enable-prefix-caching",
    "--enable-chunked-prefill", "--no-enable-chunked-prefill", "--disable-log-requests", "--disable-log-stats",
    "--enable-log-requests", "--enable-auto-tool-choice", "--disable-fastapi-docs", "--headless",
    "--disable-radix-cache", "--enable-metrics", "--skip-server-warmup", "--disable-cuda-graph",
    "--speculative-adaptive",
})


@dataclass(frozen=True)
class Argv:
    """What one argv sets: each named flag's occurrences in order, and the positional argument ("": none)."""

    given: tuple[tuple[str, str], ...]  # (flag, its value; a list flag's first), in the order given
    positional: str = ""

    def last(self) -> dict[str, str]:
        """flag -> its value, the last occurrence winning (argparse's store)."""
        return dict(self.given)


def read_argv(args: Sequence[str], flags: Collection[str], *, positional: bool = False) -> Argv:
    """What `args` (the server's arguments, after its program) gives for `flags`, and, with `positional`, its
    first positional argument, as the server's argparse reads them (the module's doc says the rules)."""
    given: list[tuple[str, str]] = []
    first = ""
    i = 0
    while i < len(args):
        arg = args[i]
        flag, eq, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if flag in flags:
            if not eq:
                if i + 1 >= len(args):
                    break  # `--port` with nothing after it: argparse refuses, nothing is set
                i += 1
                value = args[i]
            given.append((flag, value))
            if flag in LISTS:  # the rest of an nargs="+" list
                while i + 1 < len(args) and not args[i + 1].startswith("-"):
                    i += 1
        elif arg.startswith("-") and len(arg) > 1:  # an option this caller's table does not name
            while not eq and flag not in SWITCHES and i + 1 < len(args) and not args[i + 1].startswith("-"):
                i += 1  # the word after it is taken for its value; a list's every word
                if flag not in LISTS:
                    break
        elif positional and not first:
            first = arg
        i += 1
    return Argv(tuple(given), first)
