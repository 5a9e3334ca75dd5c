"""The test layers themselves: what marks a test `system`, and what a missing tool does in CI."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest

from tests import ci, conftest


@pytest.fixture
def manager() -> str:
    """Named like conftest's systemd manager, but a plain value: its tests stay in-process."""
    return "a stand-in"


def test_a_fixture_named_like_a_real_world_one_does_not_mark_its_tests(manager: str,
                                                                        request: pytest.FixtureRequest) -> None:
    assert manager == "a stand-in"
    assert request.node.get_closest_marker("system") is None


def fixture_def(fn: object, *argnames: str) -> SimpleNamespace:
    return SimpleNamespace(func=inspect.unwrap(fn), argnames=argnames)  # type: ignore[arg-type]


def item(**defs: tuple[SimpleNamespace, ...]) -> pytest.Item:
    return SimpleNamespace(_fixtureinfo=SimpleNamespace(name2fixturedefs=defs))  # type: ignore[return-value]


def local_manager() -> None:
    """Stands for a module's own fixture named `manager`."""


def test_the_real_world_is_known_by_the_fixtures_definition() -> None:
    real = fixture_def(conftest.manager)
    assert conftest.uses_the_real_world(item(manager=(real,)))
    assert conftest.uses_the_real_world(item(x=(fixture_def(local_manager),), docker=(fixture_def(conftest.docker),)))
    # A module's own `manager` overrides conftest's: only the definition pytest uses counts ...
    assert not conftest.uses_the_real_world(item(manager=(real, fixture_def(local_manager))))
    # ... unless it builds on the one it overrides, by asking for its own name.
    assert conftest.uses_the_real_world(item(manager=(real, fixture_def(local_manager, "manager"))))
    assert not conftest.uses_the_real_world(item())


def test_a_missing_tool_skips_here_and_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ci, "IN_CI", False)
    with pytest.raises(pytest.skip.Exception, match="genready-no-such-tool is not installed"):
        ci.tool("genready-no-such-tool")
    monkeypatch.setattr(ci, "IN_CI", True)
    with pytest.raises(pytest.fail.Exception, match="cannot run in CI: genready-no-such-tool is not installed"):
        ci.tool("genready-no-such-tool")
    assert ci.tool("sh").endswith("/sh")
    ci.require(None, "anything")  # nothing missing: nothing happens, in CI or not
