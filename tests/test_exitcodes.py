"""The exit-code table is defined once (genready.exitcodes); --help and the README say the same."""

from __future__ import annotations

from pathlib import Path

import pytest

from genready import cli, exitcodes
from genready.exitcodes import Exit

README = Path(__file__).resolve().parent.parent / "README.md"


def test_every_code_has_a_meaning() -> None:
    assert set(exitcodes.MEANING) == set(Exit)


def test_readme_table_is_the_table() -> None:
    assert exitcodes.markdown_table() in README.read_text(), "regenerate the README's exit-code table"


def test_help_lists_every_code(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["wait", "--help"])
    assert e.value.code == 0
    assert exitcodes.help_text() in capsys.readouterr().out
