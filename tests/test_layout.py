"""The product apart from its tooling: what each entry point imports (in a fresh interpreter)."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from genready.apis import APIS
from genready.servers import kinds
from tests.test_imports import parsed  # one parse of each module for both files' rules


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
    heavy = imported_by("genready.sweep.report.main") & {"aiohttp", "pystemd"}
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


def _flat(word: str) -> str:
    return re.sub(r"[^a-z0-9]", "", word.lower())


# Every name a server goes by, derived from servers/kinds.py's KINDS (a new kind is guarded the moment it is
# added): its kind name, label, simulator profile and programs, and the api names (apis.APIS).
SERVER_WORDS = frozenset({w.lower() for k in kinds.KINDS
                          for w in (k.name, k.label, k.sim_profile, *k.programs, *k.serve_programs, *k.modules) if w}
                         | set(APIS))
# ... as they appear inside identifiers (`is_sglang`, `summary.sglang_openai`, `LLAMA_CPP`): without case or
# separators
SERVER_TOKENS = frozenset(_flat(w) for k in kinds.KINDS
                          for w in (k.name, k.label, k.sim_profile, *k.programs, *k.serve_programs) if _flat(w))
KIND_NAMES = frozenset(name for name, v in vars(kinds).items() if isinstance(v, kinds.ServerKind))
# Where a server's name is the point: the kinds themselves, and the API table (SGLang's own wire format is an
# api named "sglang", apis.py)
NAMED_HERE = frozenset({"servers", "apis.py"})


def server_comparisons(path: Path, *, names: bool = True) -> list[str]:
    """`api == "…"`, `x == "sglang"`, `x in ("sglang", …)`, `kind is VLLM`, a dict or `match` keyed by server
    names, and a server's name inside an identifier (`is_sglang()`, `summary.sglang`, `_sglang_average`) in one
    module (without `names`: the comparisons and tables alone): what a server kind (servers/kinds.py) should
    answer instead."""
    import ast

    def named(node: ast.AST) -> str:
        return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""

    def words(node: ast.AST | None) -> set[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value.lower()}
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return {e.value.lower() for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        return set()

    def identifiers(node: ast.AST) -> list[str]:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            return [node.name]
        if isinstance(node, ast.Name | ast.Attribute):
            return [named(node)]
        if isinstance(node, ast.arg):
            return [node.arg]
        if isinstance(node, ast.keyword) and node.arg:
            return [node.arg]
        if isinstance(node, ast.alias):
            return [node.asname or node.name.split(".")[-1]]
        return []

    found = []
    for node in ast.walk(parsed(path)):
        where = f"{path.name}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            strings = set().union(*(words(s) for s in sides))
            if (strings & SERVER_WORDS or (strings and any(named(s) == "api" for s in sides))
                    or any(named(s) in KIND_NAMES for s in sides)):
                found.append(f"{where}: {ast.unparse(node)}")
        elif isinstance(node, ast.Dict) and set().union(*(words(k) for k in node.keys)) & SERVER_WORDS:
            found.append(f"{where}: a table keyed by server names")
        elif isinstance(node, ast.MatchValue) and words(node.value) & SERVER_WORDS:
            found.append(f"{where}: case {ast.unparse(node.value)}")
        if names:
            found += [f"{where}: {name}" for name in identifiers(node) if any(t in _flat(name) for t in SERVER_TOKENS)]
    return found


def test_no_server_is_told_apart_by_name_outside_the_server_kinds(tmp_path: Path) -> None:
    """What differs between the servers is asked of a ServerKind (servers/kinds.py), never `if api == "sglang"`,
    `summary.sglang` or `is_sglang()`: a new kind is then one object plus its simulator profile."""
    root = Path(__file__).resolve().parents[1] / "daemon" / "genready"
    found = [f for path in sorted(root.rglob("*.py")) if not NAMED_HERE & {path.parent.name, path.name}
             for f in server_comparisons(path)]
    assert not found, "ask a server kind instead:\n" + "\n".join(found)
    # The simulator asks its profile (genready_dev/simprofiles.py, keyed by the kind), never a server's name;
    # its per-server functions may carry one (llamacpp_error). (realservers.py's tables are of builds.)
    dev = root.parent / "genready_dev"
    found = [f for path in sorted(dev.glob("sim*.py")) for f in server_comparisons(path, names=False)]
    assert not found, "ask the simulator's profile instead:\n" + "\n".join(found)
    # the check itself finds each form, for every kind's name
    probe = tmp_path / "probe.py"
    probe.write_text('if t.api == "x": pass\nif name in ("a", "vllm"): pass\nif server is VLLM: pass\n'
                     'if summary.sglang: pass\ndef is_sglang(): pass\nT = {"llama.cpp": 1}\n'
                     'match k:\n    case "sglang": pass\n')
    assert len(server_comparisons(probe)) == 8, server_comparisons(probe)
    for j, k in enumerate(kinds.KINDS):
        each = tmp_path / f"kind{j}.py"  # parsed() caches by path
        each.write_text(f"if x == {k.name!r}: pass\ndef read_{_flat(k.name)}(): pass\n")
        assert len(server_comparisons(each)) == 2, k.name


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


MAX_DEV_MODULE_LINES = 1000


def test_no_dev_module_over_1000_lines() -> None:
    """The development tooling too (genready_dev/sim.py reached 1,410 lines, its Simulator 47 methods, before its
    profiles, request parsing and flags became modules of their own): a higher cap than the product's, since a
    simulator or a demo is read less often, but a cap."""
    root = Path(__file__).resolve().parents[1] / "daemon" / "genready_dev"
    over = {p.name: n for p in sorted(root.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_DEV_MODULE_LINES}
    assert not over, f"over {MAX_DEV_MODULE_LINES} lines: {over}"


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
