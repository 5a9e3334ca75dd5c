"""The one reader of a server's ExecStart= argv (servers/argv.py): `init` and the engine confirm read alike.

Each case below is one where the two former readers (unitinit._flags and engineconfig.expected) disagreed with
each other or with the server's own argparse: `--flag=value` before the positional, a repeated nargs="+" flag,
the words of such a list taken for the positional, a switch before the positional.
"""

from __future__ import annotations

import pytest

from genready.servers import engineconfig as ec
from genready.servers import kinds
from genready.servers.argv import Argv, read_argv
from genready.tools import unitinit

VLLM = ["/usr/local/bin/vllm", "serve"]


def init_model(args: list[str]) -> str:
    """The model `init` proposes for a vLLM unit running `vllm serve ARGS`."""
    prop = unitinit.target_from_exec("srv.service", [*VLLM, *args], {})
    return str(prop.table.get("model", ""))


def engine_model_tag(args: list[str]) -> str:
    """The model_tag the engine confirm expects vLLM to report for the same arguments ("": none)."""
    read = kinds.VLLM.engine
    assert read is not None
    return ec.expected(read, args).get("model_tag", ("", ""))[1]


@pytest.mark.parametrize(("args", "model"), [
    (["Qwen/Q"], "Qwen/Q"),
    (["--port", "8001", "Qwen/Q"], "Qwen/Q"),  # init read the positional only first: it proposed no model
    (["--max-model-len=4096", "Qwen/Q"], "Qwen/Q"),  # the confirm skipped a word after any -option: unconfirmed
    (["--enforce-eager", "Qwen/Q"], "Qwen/Q"),  # a switch takes no value: the word after it is the positional
    (["--tokenizer", "Qwen/T", "Qwen/Q"], "Qwen/Q"),  # an option unknown to both tables still takes its value
])
def test_init_and_the_engine_confirm_read_the_same_positional(args: list[str], model: str) -> None:
    assert (init_model(args), engine_model_tag(args)) == (model, model)


def test_a_lists_words_are_not_the_positional() -> None:
    # argparse's nargs="+" takes every word up to the next option: `b` is a served name, no model_tag (the confirm
    # expected vLLM to report model_tag=b, and marked the point config_mismatch when it did not)
    assert engine_model_tag(["--served-model-name", "a", "b", "--port", "8001"]) == ""
    assert init_model(["--served-model-name", "a", "b", "--port", "8001"]) == "a"


def test_a_repeated_list_flag_the_last_wins() -> None:
    # argparse stores the last occurrence; init kept the first
    assert init_model(["Q/Q", "--served-model-name", "old", "x", "--served-model-name", "new"]) == "new"


def test_the_reader_itself() -> None:
    flags = {"--port", "--served-model-name", "-tp"}
    got = read_argv(["--port=1", "-tp", "2", "--served-model-name", "a", "b", "--port", "3", "--x", "y", "M", "N"],
                    flags, positional=True)
    assert got == Argv((("--port", "1"), ("-tp", "2"), ("--served-model-name", "a"), ("--port", "3")), "M")
    assert got.last() == {"--port": "3", "-tp": "2", "--served-model-name": "a"}
    # a flag at the end with no value sets nothing (argparse refuses to start); no positional unless asked
    assert read_argv(["M", "--port"], flags) == Argv(())
