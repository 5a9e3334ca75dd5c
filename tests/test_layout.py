"""The product apart from its tooling: what each entry point imports (in a fresh interpreter)."""

from __future__ import annotations

import ast
import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest


@functools.cache
def parsed(path: Path) -> ast.Module:
    """PATH's syntax tree, parsed once for every fitness test here (each walks every module)."""
    return ast.parse(path.read_text())


def imported_by(module: str) -> set[str]:
    code = f"import json, sys, {module}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return {m.split(".")[0] for m in json.loads(out)}


@pytest.mark.system
def test_the_cli_imports_only_what_parsing_needs() -> None:
    # `genready wait X --timeout 0` runs in ExecCondition=: no event loop, HTTP server, D-Bus or
    # dev tooling before a subcommand asks for it (bench/cli_start.py measures the time).
    heavy = imported_by("genready.cli") & {"asyncio", "aiohttp", "pystemd", "prometheus_client", "genready_dev",
                                          "tomli_w"}
    assert not heavy


@pytest.mark.system
def test_a_sweep_report_imports_nothing_a_sweeps_run_needs() -> None:
    # `sweep report` over 64 MiB is timed (bench/sweep_report_axes.py), its start-up included: the HTTP client,
    # D-Bus and the sweep's steps cost ~0.2 s there, and a report talks to no server. (asyncio and
    # prometheus_client's text parser still come with the server kinds' counter names: ~0.08 s.)
    heavy = imported_by("genready.sweep.reportmain") & {"aiohttp", "pystemd"}
    assert not heavy, heavy


@pytest.mark.parametrize("module", ["genready.serve.daemon", "genready.benchclient", "genready.client.client"])
@pytest.mark.system
def test_the_product_never_imports_the_dev_tooling(module: str) -> None:
    assert "genready_dev" not in imported_by(module)


def test_the_architecture_layout_names_every_module() -> None:
    """docs/architecture.md's layout table is the map a newcomer reads: a module missing from it is drift."""
    root = Path(__file__).resolve().parents[1]
    doc = (root / "docs" / "architecture.md").read_text()
    layout = doc[doc.index("## Layout"):]
    for package in ("genready", "genready_dev"):
        for path in sorted((root / "daemon" / package).rglob("*.py")):
            if path.stem != "__init__":
                assert f"`{path.stem}`" in layout, f"docs/architecture.md's Layout does not name {package}.{path.stem}"
    for folder in sorted(p for p in (root / "daemon" / "genready").iterdir() if (p / "__init__.py").exists()):
        assert f"`{folder.name}/`" in layout, f"docs/architecture.md's Layout does not name the folder {folder.name}/"


def test_at_most_thirteen_modules_at_the_top() -> None:
    """The folders are the map: a module that lands at the top instead of in its folder is drift.
    The top holds what every folder shares (config, vocab, timewords, log, ...): 13 since the time
    words got one module of their own (STATUS=, the API, the records and the CLI all write times)."""
    top = [p.stem for p in (Path(__file__).resolve().parents[1] / "daemon" / "genready").glob("*.py")]
    assert len(set(top) - {"__init__"}) <= 13, sorted(top)


def test_one_definition_of_each_time_word() -> None:
    """`iso()` and `duration()` are defined in timewords.py only: two spellings of one time drift
    apart (STATUS= once wrote 6m02s where the CLI wrote 6m2s)."""
    import ast

    root = Path(__file__).resolve().parents[1] / "daemon" / "genready"
    for path in sorted(root.rglob("*.py")):
        if path.name == "timewords.py":
            continue
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.FunctionDef) and node.name in ("iso", "from_iso", "duration", "ago"):
                raise AssertionError(f"{path.relative_to(root)} defines {node.name}(): use genready.timewords")


def test_only_durable_makes_files_durable() -> None:
    """Atomic replace, synced append and fsync live in store/durable.py: five copies of them once
    drifted apart (one kept the umask's mode, one wrote through links, one left temporary files)."""
    root = Path(__file__).resolve().parents[1] / "daemon" / "genready"
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).as_posix() == "store/durable.py":
            continue
        text = path.read_text()
        for word in ("os.replace(", "os.rename(", "fsync(", "mkstemp(", "O_APPEND"):
            assert word not in text, f"{path.relative_to(root)} uses {word!r}: use genready.store.durable"


def test_bench_scripts_do_not_import_tests() -> None:
    root = Path(__file__).resolve().parents[1]
    for path in sorted((root / "bench").glob("*.py")):
        text = path.read_text()
        assert "from tests" not in text and "import tests" not in text, path.name
        # Putting the checkout on sys.path was how bench once reached tests: the scripts run on
        # the installed packages (genready, genready_dev), like any user of them.
        assert "sys.path" not in text, path.name


def test_only_the_systemd_package_talks_to_systemd() -> None:
    """pystemd (and libsystemd through ctypes) are used in daemon/genready/systemd/ only, lazy
    imports included: every other module asks `systemd/` (bus, snapshot, worker, control, ...)."""
    root = Path(__file__).resolve().parents[1] / "daemon" / "genready"
    for path in sorted(root.rglob("*.py")):
        if path.parent.name == "systemd":
            continue
        text = path.read_text()
        for word in ("import pystemd", "from pystemd", "libsystemd", "ctypes"):
            assert word not in text, f"{path.relative_to(root)} uses {word!r}: only systemd/ may"


def _runtime_imports(path: Path, package: str, *, type_only: bool = False) -> set[str]:
    """The genready modules a file imports when it runs, lazy imports in functions included (an
    `if TYPE_CHECKING:` block is not run, so not counted unless `type_only`)."""
    import ast

    tree = parsed(path)
    skip = set() if type_only else {
        id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for child in node.body for n in ast.walk(child)}
    daemon = Path(__file__).resolve().parents[1] / "daemon"
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from genready.systemd import sdbus` imports the module genready.systemd.sdbus
            names = [f"{node.module}.{a.name}" if (daemon / Path(*node.module.split(".")) / f"{a.name}.py").exists()
                     else node.module for a in node.names]
        out |= {n for n in names if n == package or n.startswith(package + ".")}
    return out


def test_no_import_cycle_anywhere() -> None:
    """Library modules raise and `cli` maps errors to exit codes: nothing imports back up the
    chain, so no module can be half-initialised when another needs it. Imports for types only count
    too: two modules that need each other's types are one concern split in two."""
    root = Path(__file__).resolve().parents[1] / "daemon" / "genready"
    graph: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        graph[name] = {m for m in _runtime_imports(path, "genready", type_only=True) if m != name}
    assert len(graph) > 40 and graph["genready.cli"], "the import graph was not read"
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                cycle = [*trail[trail.index(dep):], dep]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep, [*trail, dep])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])


# What the rule may not know: sweeps and journals are the surfaces' business (serve/lastwords, serve/sweepcheck).
RULE_MUST_NOT_IMPORT = ("genready.systemd.unitlog", "genready.systemd.sweepdropin", "genready.tools",
                        "genready.serve", "genready.client")


def rule_imports_of_forbidden(root: Path) -> list[str]:
    """Each `rule/` module's imports of what the rule must not know, lazy ones included."""
    found = []
    for path in sorted((root / "rule").rglob("*.py")):
        for module in sorted(_runtime_imports(path, "genready")):
            if any(module == bad or module.startswith(bad + ".") for bad in RULE_MUST_NOT_IMPORT):
                found.append(f"rule/{path.name} imports {module}")
    return found


def test_the_rule_knows_only_the_rule(tmp_path: Path) -> None:
    """rule/ decides readiness: it imports no sweep, journal or output-file code, and no surface."""
    root = Path(__file__).resolve().parents[1] / "daemon" / "genready"
    assert rule_imports_of_forbidden(root) == []
    # The check can fail: a rule module that reads a unit's output is caught, lazily imported or not.
    (tmp_path / "rule").mkdir()
    (tmp_path / "rule" / "gate.py").write_text("def f():\n    from genready.systemd import unitlog\n")
    (tmp_path / "rule" / "history.py").write_text("from genready.systemd.sweepdropin import leftover\n")
    assert rule_imports_of_forbidden(tmp_path) == ["rule/gate.py imports genready.systemd.unitlog",
                                                   "rule/history.py imports genready.systemd.sweepdropin"]


SERVER_WORDS = frozenset({"sglang", "vllm", "llama.cpp", "llamacpp", "llama-server", "llama-cpp-python",
                          "openai-completions", "openai-chat"})
KIND_NAMES = frozenset({"SGLANG", "VLLM", "LLAMA_CPP", "LLAMA_CPP_PYTHON"})


def server_comparisons(path: Path) -> list[str]:
    """`api == "…"`, `x == "sglang"`, `x in ("sglang", …)` and `kind is VLLM` in one module: what a server kind
    (servers/kinds.py) should answer instead."""
    import ast

    def named(node: ast.AST) -> str:
        return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""

    def words(node: ast.AST) -> set[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value}
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        return set()

    found = []
    for node in ast.walk(parsed(path)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        strings = set().union(*(words(s) for s in sides))
        if (strings & SERVER_WORDS or (strings and any(named(s) == "api" for s in sides))
                or any(named(s) in KIND_NAMES for s in sides)):
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_server_is_told_apart_by_name_outside_the_server_kinds(tmp_path: Path) -> None:
    """What differs between SGLang, vLLM and llama.cpp is asked of a ServerKind (servers/kinds.py), never
    `if api == "sglang"`: a new kind is then one object plus its simulator profile."""
    root = Path(__file__).resolve().parents[1] / "daemon" / "genready"
    found = [f for path in sorted(root.rglob("*.py")) if path.parent.name != "servers"
             for f in server_comparisons(path)]
    assert not found, "compare with a server kind instead:\n" + "\n".join(found)
    # the check itself finds each form
    probe = tmp_path / "probe.py"
    probe.write_text('if t.api == "x": pass\nif name in ("a", "vllm"): pass\nif server is VLLM: pass\n')
    assert len(server_comparisons(probe)) == 3


def test_no_plain_append_of_a_file_others_read(tmp_path: Path) -> None:
    """Result lines (the bench client's --output, the sweep's results) go through store/durable.py's synced
    append: a plain open(…, "a") tears a line on a crash and glues the next one to it."""
    root = Path(__file__).resolve().parents[1] / "daemon" / "genready"
    found = [f for path in sorted(root.rglob("*.py")) if path.relative_to(root).as_posix() != "store/durable.py"
             for f in plain_appends(path)]
    assert not found, "append through genready.store.durable:\n" + "\n".join(found)
    probe = tmp_path / "probe.py"
    probe.write_text('open(p, "a")\nPath(p).open(mode="a+")\nopen(p, "ab").write(b"")\nopen(p, "r")\n')
    assert len(plain_appends(probe)) == 3


def plain_appends(path: Path) -> list[str]:
    """Calls of open() or Path.open() with an append mode ("a", "ab", "a+", …) in one module."""
    import ast

    found = []
    for node in ast.walk(parsed(path)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if not ((isinstance(func, ast.Name) and func.id == "open") or (isinstance(func, ast.Attribute)
                and func.attr == "open")):
            continue
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "os":
            continue  # os.open takes flags, not a mode string
        is_path_open = isinstance(func, ast.Attribute)
        modes = [k.value for k in node.keywords if k.arg == "mode"]
        if len(node.args) > (0 if is_path_open else 1):
            modes.append(node.args[0 if is_path_open else 1])
        if any(isinstance(m, ast.Constant) and isinstance(m.value, str) and "a" in m.value for m in modes):
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_one_way_to_write_html() -> None:
    """Escaping, the Content-Security-Policy and a page's head live in web/htmlpage.py: the three pages
    once had three stylesheets, three escapes and three policies, and 260 lines of CSS and JavaScript in
    Python strings no linter read (the CSS and JS are web/'s package data files now)."""
    import ast

    root = Path(__file__).resolve().parents[1] / "daemon" / "genready"
    words = ("content-security-policy", "default-src", "sha256-", "<!doctype html", "<style", "<script")
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel == "web/htmlpage.py":
            continue
        tree = parsed(path)
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                      and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                assert not [m for m in mods if m == "html" or m.startswith("html.")], \
                    f"{rel} imports html: escape with genready.web.htmlpage.text"
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                # a whole header name, or the makings of a policy or a page's head (prose may name the header)
                low = node.value.lower()
                found = [w for w in words if w in low and (w != words[0] or low == w)]
                assert not found, f"{rel} writes {found[0]!r}: build pages with genready.web.htmlpage"


MAX_MODULE_LINES = 700


def test_no_product_module_over_700_lines() -> None:
    """A module past 700 lines has been doing more than one job (tools/sweep.py grew to 1,135 lines and
    about twelve before it became the sweep/ package): split it by concern before it gets there."""
    root = Path(__file__).resolve().parents[1] / "daemon" / "genready"
    over = {str(p.relative_to(root)): n for p in sorted(root.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not over, f"over {MAX_MODULE_LINES} lines: {over}"


def names_realservers(node: ast.AST) -> bool:
    """`realservers.X` (genready_dev.realservers, however imported) or a text naming it (`-m genready_dev.realservers.`)
    anywhere in `node`: what "realservers." in ast.unparse(node) found, without unparsing every test (a second)."""
    def names(n: ast.AST) -> bool:
        if isinstance(n, ast.Attribute):
            return "realservers" in (getattr(n.value, "id", None), getattr(n.value, "attr", None))
        return isinstance(n, ast.Constant) and isinstance(n.value, str) and "realservers." in n.value

    return any(names(n) for n in ast.walk(node))


def test_each_test_of_a_real_server_runs_after_the_build() -> None:
    # ./dev test runs the real-server tests after the build (tests/conftest.py's needs_real_servers): one that
    # runs earlier finds no server on a fresh machine and fails CI (three did: not in REAL_SERVER_FILES, unmarked)
    from tests.conftest import REAL_SERVER_FILES

    early = []
    for path in sorted(Path(__file__).parent.glob("test_*.py")):
        if path.name in REAL_SERVER_FILES or path.name == Path(__file__).name:  # this test names it too
            continue
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_") \
                    and names_realservers(node) \
                    and not any("real_servers" in ast.unparse(d) for d in node.decorator_list):
                early.append(f"{path.name}::{node.name}")
    assert not early, f"name genready_dev.realservers but are not marked @pytest.mark.real_servers: {early}"
