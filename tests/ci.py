"""Skip, or fail under CI=true: the one rule for a test that cannot run on this machine.

Locally a missing systemd, container engine or tool skips with its reason; under CI=true the
same thing fails, because a skipped check in CI hides exactly what the check exists to catch.
"""

from __future__ import annotations

import os
import shutil

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(reason: str | None, what: str) -> None:
    """Nothing when `reason` is None; else skip `what` with the reason, or fail under CI=true."""
    if reason is None:
        return
    if IN_CI:
        pytest.fail(f"{what} cannot run in CI: {reason}")
    pytest.skip(f"{what}: {reason}")


def tool(name: str, hint: str = "") -> str:
    """The path of the program `name` on PATH; skips without it (fails under CI=true)."""
    path = shutil.which(name)
    require(None if path else f"{name} is not installed" + (f" ({hint})" if hint else ""), f"a test that needs {name}")
    assert path is not None
    return path
