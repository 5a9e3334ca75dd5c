"""The suite's own rules: what marks a test `system`, what a missing tool does in CI, no sleeps."""

from __future__ import annotations

import ast
import inspect
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests import ci, conftest
from tests.test_imports import parsed  # one parse of each file for this rule and the import rules

TESTS = Path(__file__).resolve().parent


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


def sleeps_in_tests(folder: Path = TESTS) -> list[str]:
    """Every sleep of 0 < t < 10 s, or of a length that cannot be read, as a statement of a test function,
    a fixture or a helper (tests/*.py that are not test modules, conftest.py included), and every loop
    there that sleeps: a wait for something to happen is a `wait_for`, and a sleep before asserting that
    something did *not* happen proves nothing (the event may come later). A long sleep (a block to be
    timed out) and sleep(0) are fine, and so are functions defined inside those (a stand-in that is slow
    on purpose). `time.sleep`, `asyncio.sleep` and a `sleep` imported from either are sleeps; a length
    named by a module constant (`time.sleep(DELAY)`) is read from it."""
    found = []
    for path in sorted(folder.glob("*.py")):
        tree = parsed(path)
        sleeps = {a.asname or a.name for node in tree.body if isinstance(node, ast.ImportFrom)
                  and node.module in ("time", "asyncio") for a in node.names if a.name == "sleep"}
        constants = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign | ast.AnnAssign)
                     and isinstance(n.value, ast.Constant) and isinstance(n.value.value, int | float)
                     for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
        for fn in _checked_functions(tree, helper=not path.name.startswith("test_")):
            for node in _own_nodes(fn):
                if isinstance(node, (ast.While, ast.For, ast.AsyncFor)) and any(
                        isinstance(n, ast.Call) and _is_sleep(n, sleeps) for n in _own_nodes(node)):
                    found.append(f"{path.name}:{node.lineno} {fn.name}: a loop that sleeps (use wait_for)")
                if isinstance(node, ast.Expr):
                    call = node.value.value if isinstance(node.value, ast.Await) else node.value
                    if isinstance(call, ast.Call) and _is_sleep(call, sleeps) and call.args:
                        t = _seconds(call.args[0], constants)
                        if t is None or 0 < t < 10:
                            found.append(f"{path.name}:{node.lineno} {fn.name}: {ast.unparse(call)}")
    return found


def _checked_functions(tree: ast.Module, *, helper: bool) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """A test module's tests and fixtures (its own classes' too); every function and method of a helper."""
    tops = [*tree.body, *(n for c in tree.body if isinstance(c, ast.ClassDef) for n in c.body)]
    return [fn for fn in tops if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
            and (helper or fn.name.startswith("test_") or any("fixture" in ast.unparse(d) for d in fn.decorator_list))]


def _seconds(arg: ast.expr, constants: dict[str, float]) -> float | None:
    """A sleep's length where it can be read: a number, or a module constant's."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, int | float):
        return float(arg.value)
    if isinstance(arg, ast.Name) and arg.id in constants:
        return float(constants[arg.id])
    return None


def _own_nodes(node: ast.AST) -> list[ast.AST]:
    """`node`'s subtree without the bodies of functions and classes defined inside it."""
    out = []
    for child in ast.iter_child_nodes(node):
        out.append(child)
        if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            out.extend(_own_nodes(child))
    return out


def _is_sleep(call: ast.Call, names: set[str]) -> bool:
    return (isinstance(call.func, ast.Attribute) and call.func.attr == "sleep") or \
        (isinstance(call.func, ast.Name) and call.func.id in names)


def test_no_test_sleeps_to_wait_or_to_prove_an_absence(tmp_path: Path) -> None:
    assert sleeps_in_tests() == []
    # each form is caught: in a helper module, a fixture, a test; `from time import sleep`, a named length
    (tmp_path / "helpers.py").write_text(
        "import time\nfrom time import sleep as nap\nDELAY = 0.5\n"
        "def start():\n    while not up():\n        time.sleep(0.05)\n"
        "class Server:\n    def ready(self):\n        nap(DELAY)\n")
    (tmp_path / "test_x.py").write_text(
        "import asyncio, time, pytest\n@pytest.fixture\ndef world():\n    time.sleep(wait)\n    yield 1\n"
        "async def test_a():\n    await asyncio.sleep(1)\n    time.sleep(60)\n    time.sleep(0)\n"
        "    def slow():\n        time.sleep(1)\n")
    assert sleeps_in_tests(tmp_path) == ["helpers.py:5 start: a loop that sleeps (use wait_for)",
                                         "helpers.py:6 start: time.sleep(0.05)",
                                         "helpers.py:9 ready: nap(DELAY)",
                                         "test_x.py:4 world: time.sleep(wait)",
                                         "test_x.py:7 test_a: asyncio.sleep(1)"]


def test_only_ci_py_reads_the_ci_variable() -> None:
    """Skip-or-fail under CI=true is one rule (tests/ci.py); a copy of it drifts."""
    readers = sorted(p.name for p in TESTS.glob("*.py") if p.name not in ("ci.py", "test_suite_rules.py")
                     and ('environ.get("CI"' in p.read_text() or "environ['CI']" in p.read_text()
                          or 'environ["CI"]' in p.read_text()))
    assert readers == []


# Package registries' own addresses (issue 36 §8): what a tool fetches comes from the index its
# client is configured with (pip's, apt's), never from a host written here. "docker.io" alone is
# Debian's package name, not the registry's address; ghcr.io and quay.io are left out because an
# image name in a unit (`docker run ghcr.io/ggml-org/llama.cpp:server`) is data `genready init`
# reads, and the container tests pull nothing (their images come from a registry-free root).
REGISTRY_HOSTS = ("pypi.org", "pypi.python.org", "files.pythonhosted.org", "registry.npmjs.org", "crates.io",
                  "proxy.golang.org", "registry-1.docker.io", "index.docker.io", "huggingface.co",
                  "download.pytorch.org", "anaconda.org")
_NOT_THE_REPOSITORY = {".git", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", "build"}


def registry_hosts_named(root: Path) -> list[str]:
    """`file:line host` for every registry address written in a text file under `root` (venvs,
    caches and git's own files are not the repository's; nor is this file, which lists them)."""
    found = []
    for top, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _NOT_THE_REPOSITORY and not d.startswith(".venv")
                         and not d.endswith(".egg-info"))
        for path in (Path(top) / f for f in sorted(files)):
            if path != Path(__file__).resolve():
                found += _registry_hosts_in(path, root)
    return found


def _registry_hosts_in(path: Path, root: Path) -> list[str]:
    try:
        lines = path.read_text().lower().splitlines()
    except (UnicodeDecodeError, OSError):
        return []  # not text: a picture, say
    return [f"{path.relative_to(root)}:{n} {host}" for n, line in enumerate(lines, 1) for host in REGISTRY_HOSTS
            if host in line]


def test_no_package_registry_address_is_written_in_the_repository(tmp_path: Path) -> None:
    assert registry_hosts_named(TESTS.parent) == []
    (tmp_path / "fetch.py").write_text('URL = "https://files.pythonhosted.org/packages/x.tar.gz"\n')
    (tmp_path / "apt.sh").write_text("apt-get install docker.io\n")
    assert registry_hosts_named(tmp_path) == ["fetch.py:1 files.pythonhosted.org"]
