"""The exit-code table is defined once (genready.exitcodes); --help and the README say the same."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from genready import exitcodes
from genready.exitcodes import Exit

README = Path(__file__).resolve().parent.parent / "README.md"


def test_every_code_has_a_meaning() -> None:
    assert set(exitcodes.MEANING) == set(Exit)


def test_readme_table_is_the_table() -> None:
    assert exitcodes.markdown_table() in README.read_text(), "regenerate the README's exit-code table"


def test_help_lists_every_code() -> None:
    out = subprocess.run([sys.executable, "-m", "genready.cli", "wait", "--help"], capture_output=True, text=True,
                         check=True).stdout
    assert exitcodes.help_text() in out
