"""The suite's own rules: what marks a test `system`, what a missing tool does in CI, no sleeps."""

from __future__ import annotations

import ast
import inspect
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests import ci, conftest

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


def sleeps_in_tests() -> list[str]:
    """Every `time.sleep(c)` / `await asyncio.sleep(c)` statement with a constant 0 < c < 10 in a
    test function, and every loop there that sleeps: a wait for something to happen is a
    `wait_for`, and a sleep before asserting that something did *not* happen proves nothing
    (the event may come later). A long sleep (a block to be timed out) and sleep(0) are fine, and
    so are functions a test defines (a stand-in that is slow on purpose)."""
    found = []
    for path in sorted(TESTS.glob("*.py")):
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or not fn.name.startswith("test_"):
                continue
            for node in _own_nodes(fn):
                if isinstance(node, (ast.While, ast.For, ast.AsyncFor)) and any(
                        isinstance(n, ast.Call) and _is_sleep(n) for n in _own_nodes(node)):
                    found.append(f"{path.name}:{node.lineno} {fn.name}: a loop that sleeps (use wait_for)")
                if isinstance(node, ast.Expr):
                    call = node.value.value if isinstance(node.value, ast.Await) else node.value
                    if isinstance(call, ast.Call) and _is_sleep(call) and call.args \
                            and isinstance(c := call.args[0], ast.Constant) \
                            and isinstance(c.value, (int, float)) and 0 < c.value < 10:
                        found.append(f"{path.name}:{node.lineno} {fn.name}: {ast.unparse(call)}")
    return found


def _own_nodes(node: ast.AST) -> list[ast.AST]:
    """`node`'s subtree without the bodies of functions and classes defined inside it."""
    out = []
    for child in ast.iter_child_nodes(node):
        out.append(child)
        if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            out.extend(_own_nodes(child))
    return out


def _is_sleep(call: ast.Call) -> bool:
    return isinstance(call.func, ast.Attribute) and call.func.attr == "sleep"


def test_no_test_sleeps_to_wait_or_to_prove_an_absence() -> None:
    assert sleeps_in_tests() == []


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
