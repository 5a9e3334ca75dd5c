"""Shared fixtures: one private systemd user manager per test session, and container engines."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from typing import NoReturn, TypeVar

import pytest

from genready_dev.harness import booted_manager
from genready_dev.usermanager import UserManager, unavailable_reason
from tests.containers import Docker, Engine, Podman

E = TypeVar("E", bound=Engine)
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(scope="session")
def manager() -> Iterator[UserManager]:
    """A real systemd --user manager, booted once for the session and stopped at the end.

    Skips with the reason on a machine that cannot run one; under CI=true it fails instead,
    because a skipped systemd test in CI hides exactly what the project exists to check.
    """
    reason = unavailable_reason()
    if reason:
        if IN_CI:
            pytest.fail(f"systemd tests cannot run in CI: {reason}")
        pytest.skip(f"no private systemd user manager: {reason}")
    # set_env: in-process pystemd (user_mode) finds the bus through XDG_RUNTIME_DIR.
    with booted_manager(set_env=True) as um:
        yield um


def _engine(kind: type[E]) -> Iterator[E]:
    """A container engine for the session; skips (fails under CI=true) when it cannot run here.
    Every test container is removed afterwards, whatever the tests left."""
    reason = kind.unavailable()
    if reason:
        if IN_CI:
            pytest.fail(f"{kind.__name__.lower()} tests cannot run in CI: {reason}")
        pytest.skip(f"no {kind.__name__.lower()}: {reason}")
    engine = kind()
    try:
        yield engine
    finally:
        engine.close()


@pytest.fixture(scope="session")
def docker() -> Iterator[Docker]:
    yield from _engine(Docker)


@pytest.fixture(scope="session")
def podman() -> Iterator[Podman]:
    yield from _engine(Podman)


@pytest.fixture(scope="session")
def inaccessible_nodes(manager: UserManager) -> None:
    """Give the manager's private /run/systemd the inaccessible nodes a booted host has.

    systemd 252 running as root (even --user) masks paths for ProtectHome=yes,
    ProtectKernelTunables= and ProtectKernelLogs= with /run/systemd/inaccessible/*, which
    only PID 1 creates at boot; without them such units fail with status 226/NAMESPACE.
    The user manager made the same nodes in $XDG_RUNTIME_DIR/systemd/inaccessible, so they
    are bind-mounted there, inside the manager's own mount namespace (the host is untouched).
    """
    assert manager.proc is not None
    pid = str(manager.proc.pid)  # unshare → sh → systemd: one process, exec'd in place
    target = "/run/systemd/inaccessible"
    source = manager.runtime_dir / "systemd" / "inaccessible"
    script = f"test -e {target}/reg || {{ mkdir -p {target} && mount --bind {source} {target}; }}"
    subprocess.run(["nsenter", "-t", pid, "-m", "sh", "-c", script], check=True, timeout=10)


# What needs the real world (pyproject's `system` marker): a systemd manager, a container engine
# or the .deb is marked from the fixtures a test asks for, so a new test cannot forget its mark;
# a test that starts real processes (genready, the simulator, a CLI tool) carries the mark itself,
# and _in_process_only fails it if it does not. `pytest -m "not system"` is the in-process layer.
_SYSTEM_FIXTURES = frozenset({"manager", "docker", "podman", "inaccessible_nodes"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if names & _SYSTEM_FIXTURES or item.get_closest_marker("deb"):
            item.add_marker(pytest.mark.system)



def _refuse_processes(*args: object, **kwargs: object) -> NoReturn:
    pytest.fail("this test starts a process: mark it @pytest.mark.system (see pyproject's markers)")


@contextlib.contextmanager
def _in_process_only(item: pytest.Item) -> Iterator[None]:
    """An item not marked `system` that starts a process fails, saying so: the in-process layer
    stays fast, and honest, without anyone auditing it. Around each phase of the item, not in a
    fixture, so a module-scoped fixture that starts a simulator is caught too. (pytest's Failed
    is a BaseException: a test's own `except Exception` cannot swallow it.)"""
    if item.get_closest_marker("system"):
        yield
        return
    saved = subprocess.Popen._execute_child, os.fork  # type: ignore[attr-defined]
    subprocess.Popen._execute_child = _refuse_processes  # type: ignore[attr-defined]
    os.fork = _refuse_processes
    try:
        yield
    finally:
        subprocess.Popen._execute_child, os.fork = saved  # type: ignore[attr-defined]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with _in_process_only(item):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with _in_process_only(item):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    if nextitem is None:
        # The last item's teardown also ends the session's fixtures (the manager, the container
        # engines), which stop processes of their own whatever that item was.
        yield
        return
    with _in_process_only(item):
        yield
