"""Shared fixtures: one private systemd user manager per test session, and container engines."""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import pytest

from genready_dev.harness import booted_manager
from genready_dev.usermanager import UserManager, unavailable_reason
from tests import ci
from tests.containers import Docker, Engine, Podman

E = TypeVar("E", bound=Engine)


@pytest.fixture(scope="session")
def manager() -> Iterator[UserManager]:
    """A real systemd --user manager, booted once for the session and stopped at the end.

    Skips with the reason on a machine that cannot run one; under CI=true it fails instead,
    because a skipped systemd test in CI hides exactly what the project exists to check.
    """
    ci.require(unavailable_reason(), "a test that needs a private systemd user manager")
    # set_env: in-process pystemd (user_mode) finds the bus through XDG_RUNTIME_DIR.
    with booted_manager(set_env=True) as um:
        yield um


@pytest.fixture
def rig(manager: UserManager, tmp_path: Path) -> Iterator[Any]:
    """test_sweep's Rig (a simulator unit, a genready, a sweep's files) on the session's manager, closed after the
    test: the sweep test modules' one rig (a module with a rig of other settings defines its own)."""
    from tests.test_sweep import Rig  # lazily: the sweep tests' module, not every test's

    r = Rig(manager, tmp_path)
    yield r
    r.close()


def _engine(kind: type[E]) -> Iterator[E]:
    """A container engine for the session; skips (fails under CI=true) when it cannot run here.
    Every test container is removed afterwards, whatever the tests left."""
    ci.require(kind.unavailable(), f"a test that needs {kind.__name__.lower()}")
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
# or the .deb is marked from the fixtures a test uses, so a new test cannot forget its mark;
# a test that starts real processes (genready, the simulator, a CLI tool) carries the mark itself,
# and _in_process_only fails it if it does not. `pytest -m "not system"` is the in-process layer.
# The fixtures are known by their definitions, not their names: a module's own fixture called
# `manager` (a fake notify socket, say) overrides this one and is not the real world.
_SYSTEM_FIXTURES = frozenset(inspect.unwrap(f) for f in (manager, docker, podman, inaccessible_nodes))


def uses_the_real_world(item: pytest.Item) -> bool:
    """Does `item` use one of _SYSTEM_FIXTURES (directly or through other fixtures)? Per name, the
    definition pytest gives the item, and the one it overrides when it asks for its own name."""
    info = getattr(item, "_fixtureinfo", None)
    for name, defs in (info.name2fixturedefs.items() if info is not None else ()):
        for d in reversed(defs):
            if inspect.unwrap(d.func) in _SYSTEM_FIXTURES:
                return True
            if name not in d.argnames:  # it does not build on the definition it overrides
                break
    return False


# The system tests the Python 3.10 and 3.13 runs add to the in-process layer (`--versions-subset`;
# docs/development.md says why these): genready, its CLI and the simulator as processes on that
# interpreter, with pystemd built for it, against a real manager. Library versions are the newest
# in both, as in the .venv run, and the real servers are the same binaries whatever runs pytest.
VERSIONS_SUBSET = ("test_gate.py", "test_watcher.py", "test_reload.py", "test_frozen.py", "test_cli_client.py")


# The files whose tests run the real servers (genready_dev.realservers), and elsewhere the tests marked
# `real_servers`: `./dev test` runs the rest of a run while the servers build, and these once they are built
# (`--real-servers without|only`). On a fresh machine a real-server test in the first part fails in CI:
# tests/test_layout.py checks that each test naming genready_dev.realservers is one of them.
REAL_SERVER_FILES = ("test_llamacpp.py", "test_llama_spec.py", "test_sweep_cache.py", "test_llama_search.py")


def needs_real_servers(item: pytest.Item) -> bool:
    return item.path.name in REAL_SERVER_FILES or item.get_closest_marker("real_servers") is not None


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--versions-subset", action="store_true",
                     help="of the system tests, only those of tests/conftest.py's VERSIONS_SUBSET")
    parser.addoption("--real-servers", choices=("with", "without", "only"), default="with",
                     help="the tests of tests/conftest.py's REAL_SERVER_FILES (and those marked real_servers) "
                          "with the rest (default), "
                          "without them, or only them")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if uses_the_real_world(item) or item.get_closest_marker("deb"):
            item.add_marker(pytest.mark.system)
    real = config.getoption("real_servers")
    left_out = [i for i in items if (config.getoption("versions_subset") and i.get_closest_marker("system")
                                     and i.path.name not in VERSIONS_SUBSET)
                or (real == "without" and needs_real_servers(i))
                or (real == "only" and not needs_real_servers(i))]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        out = set(left_out)
        items[:] = [i for i in items if i not in out]


@pytest.fixture
def unrelated_pid() -> Iterator[int]:
    """The pid of a live process that is no one's parent or child here: a MainPID that owns nothing a test reaches
    (test_probe, test_owner: the foreign owner)."""
    proc = subprocess.Popen(["sleep", "60"])
    yield proc.pid
    proc.kill()
    proc.wait()


@pytest.fixture(autouse=True)
def _genready_logger_restored() -> Iterator[None]:
    """log.setup() gives the process-wide "genready" logger its own handler and propagate=False;
    a test that calls it (or cli.main) would hide every later test's genready records from caplog
    (pytest 7.2, Debian's, does not work around that: newer pytest happens to). Put it back."""
    logger = logging.getLogger("genready")
    saved = (list(logger.handlers), logger.level, logger.propagate, logger.disabled)
    yield
    logger.handlers[:] = saved[0]
    logger.setLevel(saved[1])
    logger.propagate, logger.disabled = saved[2], saved[3]


def pytest_sessionstart(session: pytest.Session) -> None:
    """matplotlib (the HTML report's) builds its font cache the first time a version of it is imported,
    and runs `fc-list` to do so: on a fresh venv the first in-process test that renders a report would
    be refused as one that starts a process. Build it here, before any test and outside that rule; in each
    pytest-xdist worker, not in the controller that hands them the tests (it runs none: 0.2-0.4 s saved)."""
    import importlib.util

    if session.config.pluginmanager.has_plugin("dsession"):  # xdist's controller
        return
    if importlib.util.find_spec("matplotlib") is not None:
        import matplotlib.font_manager  # noqa: F401


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
