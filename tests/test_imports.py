"""How the product's modules may import one another: in layers, without cycles of modules or of packages,
never another module's private names, and each name from the module that defines it.

Each rule is checked on the product and then on a small tree written here that breaks it: a rule that
cannot fail guards nothing (the review of 0881ad4 found every dodge of its round passing the old ones).
"""

from __future__ import annotations

import ast
import functools
import itertools
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DAEMON = ROOT / "daemon"


@functools.cache
def parsed(path: Path) -> ast.Module:
    """PATH's syntax tree, parsed once for every rule here and in test_layout (each walks every module)."""
    return ast.parse(path.read_text())


@functools.cache
def nodes(path: Path) -> tuple[ast.AST, ...]:
    """Every node of PATH's tree, walked once: the rules here read each module several times."""
    return tuple(ast.walk(parsed(path)))


def module_name(path: Path, daemon: Path = DAEMON) -> str:
    """`genready.probe.owner` for daemon/genready/probe/owner.py, `genready.probe` for its __init__.py."""
    rel = path.relative_to(daemon).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def is_module(name: str, daemon: Path = DAEMON) -> bool:
    where = daemon.joinpath(*name.split("."))
    return where.with_suffix(".py").exists() or (where / "__init__.py").exists()


def runtime_imports(path: Path, package: str, *, type_only: bool = False, daemon: Path = DAEMON) -> set[str]:
    """The modules of `package` a file imports when it runs, lazy imports in functions included (an
    `if TYPE_CHECKING:` block is not run, so not counted unless `type_only`)."""
    skip = set() if type_only else {
        id(n) for node in nodes(path) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for child in node.body for n in ast.walk(child)}
    out: set[str] = set()
    for node in nodes(path):
        if id(node) in skip:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from genready.systemd import sdbus` imports the module genready.systemd.sdbus
            names = [f"{node.module}.{a.name}" if is_module(f"{node.module}.{a.name}", daemon) else node.module
                     for a in node.names]
        out |= {n for n in names if n == package or n.startswith(package + ".")}
    return out


@functools.cache
def import_graph(daemon: Path = DAEMON, package: str = "genready") -> dict[str, set[str]]:
    """module -> the modules of `package` it imports, imports for types only counted: two modules that
    need each other's types are one concern split in two."""
    graph = {}
    for path in sorted((daemon / package).rglob("*.py")):
        name = module_name(path, daemon)
        graph[name] = {m for m in runtime_imports(path, package, type_only=True, daemon=daemon) if m != name}
    return graph


def cycle_in(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of `graph` as [a, b, ..., a], or [] when there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, trail: list[str]) -> list[str]:
        state[node] = 1
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return [*trail[trail.index(dep):], dep]
            if dep not in state and (found := visit(dep, [*trail, dep])):
                return found
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node, [node])):
            return found
    return []


def part_of(module: str) -> str:
    """What the layers and the package rule are about: a folder of the package (`probe` for
    genready.probe.owner), or a module at the top (`config`); `genready` itself is the package's __init__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def part_graph(graph: dict[str, set[str]]) -> dict[str, dict[str, list[str]]]:
    """part -> part it imports -> the module imports that make the arrow (`config -> genready.probe.endpoint`)."""
    out: dict[str, dict[str, list[str]]] = {}
    for module, deps in graph.items():
        for dep in deps:
            if part_of(dep) != part_of(module):
                out.setdefault(part_of(module), {}).setdefault(part_of(dep), []).append(f"{module} -> {dep}")
    return out


def test_no_import_cycle_anywhere() -> None:
    """Library modules raise and `cli` maps errors to exit codes: nothing imports back up the
    chain, so no module can be half-initialised when another needs it."""
    graph = import_graph()
    assert len(graph) > 40 and graph["genready.cli"], "the import graph was not read"
    assert cycle_in(graph) == [], "import cycle: " + " -> ".join(cycle_in(graph))


def package_cycle(daemon: Path = DAEMON) -> str:
    """A cycle between the package's folders and top modules, with the imports that make each arrow."""
    parts = part_graph(import_graph(daemon))
    found = cycle_in({p: set(deps) for p, deps in parts.items()})
    return "; ".join(f"{a} -> {b} ({parts[a][b][0]})" for a, b in itertools.pairwise(found))


def write_tree(root: Path, files: dict[str, str]) -> Path:
    """A `genready` package under `root` from {relative path: text}, each folder with its __init__.py."""
    for rel, text in files.items():
        path = root / "genready" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        for folder in [path.parent, *path.parent.parents]:
            if folder == root:
                break
            (folder / "__init__.py").touch()
        path.write_text(text)
    return root


def test_no_import_cycle_between_packages(tmp_path: Path) -> None:
    """A folder and a top module (or two folders) that import each other are one concern in two places,
    though no module imports back: config imported probe/endpoint for the Endpoint it builds while
    probe/probe imported config for the TargetConfig it probes (review 0881ad4 §2.8)."""
    assert package_cycle() == ""
    # The module rule alone passes this tree; the package rule does not.
    tree = write_tree(tmp_path, {"config.py": "from genready.probe.endpoint import Endpoint\n",
                                 "probe/endpoint.py": "", "probe/probe.py": "from genready import config\n"})
    assert cycle_in(import_graph(tree)) == []
    assert package_cycle(tree) == ("config -> probe (genready.config -> genready.probe.endpoint); "
                                   "probe -> config (genready.probe.probe -> genready.config)")


# docs/architecture.md's layers, bottom up. A module imports from the layers below its own, never from one
# above; within a layer only the core's modules import one another (in one direction: the package rule),
# the folders of one layer are apart. A new folder or top module is given its layer here and in the doc.
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    ("core", frozenset({"genready", "compat", "_compat_async", "timewords", "vocab", "redact", "console",
                        "exitcodes", "log", "apis", "reach", "config", "store", "servers"})),
    ("what pages are", frozenset({"web"})),
    ("reading the world", frozenset({"systemd", "probe"})),
    ("the rule and the GPUs", frozenset({"rule", "gpu"})),
    ("surfaces and jobs", frozenset({"serve", "client", "tools"})),
    ("the sweep", frozenset({"sweep"})),
    ("entry points", frozenset({"cli", "benchclient"})),
)


def layer_of(part: str) -> int | None:
    return next((n for n, (_, parts) in enumerate(LAYERS) if part in parts), None)


def layering_breaches(daemon: Path = DAEMON) -> list[str]:
    """Each import up a layer or across one (core's excepted), and each part no layer names."""
    graph = import_graph(daemon)
    found = sorted(f"{part_of(m)} is in no layer (tests/test_imports.py LAYERS, docs/architecture.md)"
                   for m in graph if layer_of(part_of(m)) is None)
    for part, deps in sorted(part_graph(graph).items()):
        mine = layer_of(part)
        for dep, why in sorted(deps.items()):
            theirs = layer_of(dep)
            if mine is None or theirs is None:
                continue
            if theirs > mine or (theirs == mine and LAYERS[mine][0] != "core"):
                where = "above" if theirs > mine else "beside"
                found.append(f"{part} ({LAYERS[mine][0]}) imports {dep} ({LAYERS[theirs][0]}, {where} it): {why[0]}")
    return sorted(set(found))


def test_each_layer_imports_only_the_layers_below_it(tmp_path: Path) -> None:
    """The layering docs/architecture.md states, for every folder and top module: the core imports no
    folder above it, nothing below the surfaces imports serve/, client/ or tools/, the surfaces do not
    import each other. It stands for the old count of top modules (at most 13), which kept nothing in
    place: it pushed Endpoint into probe/ and made config import a folder above it."""
    assert layering_breaches() == []
    tree = write_tree(tmp_path, {"config.py": "from genready.probe.endpoint import Endpoint\n",
                                 "probe/endpoint.py": "", "serve/api.py": "from genready.tools import x\n",
                                 "tools/x.py": "", "rule/gate.py": "", "newtop.py": ""})
    assert layering_breaches(tree) == [
        "config (core) imports probe (reading the world, above it): genready.config -> genready.probe.endpoint",
        "newtop is in no layer (tests/test_imports.py LAYERS, docs/architecture.md)",
        "serve (surfaces and jobs) imports tools (surfaces and jobs, beside it): "
        "genready.serve.api -> genready.tools.x"]


def test_every_layer_is_in_the_architecture_doc() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    layers = doc[doc.index("## Layers"):doc.index("## Layout")]
    for name, parts in LAYERS:
        assert name in layers, f"docs/architecture.md's Layers does not name the layer {name!r}"
        for part in parts - {"genready", "_compat_async"}:
            assert f"`{part}`" in layers or f"`{part}/`" in layers, f"docs/architecture.md's Layers lacks {part}"


# What the rule may not know: sweeps and journals are the surfaces' business (serve/lastwords, serve/sweepcheck).
RULE_MUST_NOT_IMPORT = ("genready.systemd.unitlog", "genready.systemd.sweepdropin", "genready.tools",
                        "genready.serve", "genready.client")


def rule_imports_of_forbidden(root: Path) -> list[str]:
    """Each `rule/` module's imports of what the rule must not know, lazy ones included."""
    found = []
    for path in sorted((root / "rule").rglob("*.py")):
        for module in sorted(runtime_imports(path, "genready")):
            if any(module == bad or module.startswith(bad + ".") for bad in RULE_MUST_NOT_IMPORT):
                found.append(f"rule/{path.name} imports {module}")
    return found


def test_the_rule_knows_only_the_rule(tmp_path: Path) -> None:
    """rule/ decides readiness: it imports no sweep, journal or output-file code, and no surface."""
    assert rule_imports_of_forbidden(DAEMON / "genready") == []
    # The check can fail: a rule module that reads a unit's output is caught, lazily imported or not.
    (tmp_path / "rule").mkdir()
    (tmp_path / "rule" / "gate.py").write_text("def f():\n    from genready.systemd import unitlog\n")
    (tmp_path / "rule" / "history.py").write_text("from genready.systemd.sweepdropin import leftover\n")
    assert rule_imports_of_forbidden(tmp_path) == ["rule/gate.py imports genready.systemd.unitlog",
                                                   "rule/history.py imports genready.systemd.sweepdropin"]


# --- names: private ones stay home, every name comes from its own home ---------------------------------------

OURS = ("genready", "genready_dev")


def python_files(root: Path = ROOT) -> Iterator[Path]:
    """The product, the dev tooling and the benchmark scripts: what the naming rules hold for."""
    for folder in (root / "daemon" / "genready", root / "daemon" / "genready_dev", root / "bench"):
        yield from sorted(folder.rglob("*.py"))


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def module_aliases(path: Path, daemon: Path) -> dict[str, str]:
    """local name -> our module it stands for (`import genready.x as y`, `from genready.sweep import html`)."""
    out = {}
    for node in nodes(path):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in OURS:
                    out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in OURS:
            for a in node.names:
                if is_module(f"{node.module}.{a.name}", daemon):
                    out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def private_name_uses(path: Path, daemon: Path = DAEMON) -> list[str]:
    """`from x import _y` and `x._y` of our modules in one file. A private module (`_compat_async`) may be
    imported by its own package's modules: its names are private to the package, not to a module."""
    found = []
    here = module_name(path, daemon) if path.is_relative_to(daemon) else ""
    for node in nodes(path):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in OURS:
            for a in node.names:
                own_package = is_module(f"{node.module}.{a.name}", daemon) and here.rpartition(".")[0] == node.module
                if private(a.name) and not own_package:
                    found.append(f"{path.name}:{node.lineno}: from {node.module} import {a.name}")
    aliases = module_aliases(path, daemon)
    for node in nodes(path):
        if isinstance(node, ast.Attribute) and private(node.attr) and isinstance(node.value, ast.Name) \
                and node.value.id in aliases:
            found.append(f"{path.name}:{node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_no_module_uses_another_modules_private_names(tmp_path: Path) -> None:
    """A name with a leading underscore is its module's own: one that others need is public, named so and
    documented. sweep/loadreport once called 18 of sweep/html's private helpers, themselves private aliases
    of plotrules' public functions; probe/container four of probe/owner's."""
    found = [f for path in python_files() for f in private_name_uses(path)]
    assert not found, "use a public name (make it public where it is defined):\n" + "\n".join(found)
    (tmp_path / "loadreport.py").write_text("from genready.sweep.report import html\nfrom genready.probe.owner import "
                                           "_stat, find_owner\nhtml._shown(1)\nhtml.plottable(2)\n")
    assert private_name_uses(tmp_path / "loadreport.py") == ["loadreport.py:2: from genready.probe.owner import _stat",
                                                             "loadreport.py:3: html._shown"]


@functools.cache
def imported_names(module: str, daemon: Path = DAEMON) -> dict[str, str]:
    """The names `module` binds at its top by importing them from our other modules: name -> its home."""
    where = daemon.joinpath(*module.split("."))
    path = where / "__init__.py" if (where / "__init__.py").exists() else where.with_suffix(".py")
    out = {}
    for node in parsed(path).body:
        # a top-level import, or one under `if TYPE_CHECKING:` / a version test
        for n in [node, *(ast.walk(node) if isinstance(node, ast.If | ast.Try) else ())]:
            if isinstance(n, ast.ImportFrom) and n.module and n.module.split(".")[0] in OURS and n.level == 0:
                for a in n.names:
                    if not is_module(f"{n.module}.{a.name}", daemon):
                        out[a.asname or a.name] = n.module
    return out


def facade(home: str, via: str) -> bool:
    """A private module's names reached through its package's public module: compat hands out
    _compat_async's (loaded on first use, so that the CLI does not pay for asyncio and aiohttp)."""
    return private(home.rpartition(".")[2]) and home.rpartition(".")[0] == via.rpartition(".")[0]


def reexports(path: Path, daemon: Path = DAEMON) -> list[str]:
    """The re-export shims of one file, and its uses of others':
    - `from x import y as y` (or `import x.y as y`), the spelling that marks a name as re-exported;
    - `__all__` naming a name imported from another part of the package;
    - `NAME = other.NAME` / `NAME: Final = imported_name` at the top, unused here: another part's name in a
      second home (a copy the module uses itself is its own word for it, not a shim);
    - `from m import y` / `m.y` where m only imported y from another part: import y from its home."""
    found = []
    here = module_name(path, daemon) if path.is_relative_to(daemon) else ""
    mine = imported_names(here, daemon) if here else {}
    aliases = module_aliases(path, daemon)
    used = {n.id for n in nodes(path) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    for node in nodes(path):
        if isinstance(node, ast.ImportFrom | ast.Import) and any(a.asname and a.asname == a.name.rpartition(".")[2]
                                                                for a in node.names):
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)} (a re-export)")
    for node in parsed(path).body if here else ():  # a shim is a module's; a test's or a script's copy is its own
        target, value = ((node.targets[0], node.value) if isinstance(node, ast.Assign) and len(node.targets) == 1
                         else (node.target, node.value) if isinstance(node, ast.AnnAssign) else (None, None))
        if not isinstance(target, ast.Name) or (target.id in used and target.id != "__all__"):
            continue
        if target.id == "__all__" and isinstance(value, ast.List | ast.Tuple):
            for e in value.elts:
                if isinstance(e, ast.Constant) and e.value in mine and part_of(mine[e.value]) != part_of(here) \
                        and not facade(mine[e.value], here):
                    found.append(f"{path.name}:{node.lineno}: __all__ names {e.value} (a re-export of {mine[e.value]})")
        elif isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name) and value.value.id in aliases \
                and part_of(aliases[value.value.id]) != part_of(here):
            found.append(f"{path.name}:{node.lineno}: {target.id} = {ast.unparse(value)} (a copy of another's name)")
        elif isinstance(value, ast.Name) and value.id in mine and part_of(mine[value.id]) != part_of(here):
            found.append(f"{path.name}:{node.lineno}: {target.id} = {value.id} (a copy of {mine[value.id]}'s name)")

    def through(via: str, name: str, line: int) -> None:
        home = imported_names(via, daemon).get(name)
        if home and part_of(home) != part_of(via) and not facade(home, via):
            found.append(f"{path.name}:{line}: {name} through {via} (import it from {home})")

    for node in nodes(path):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in OURS \
                and is_module(node.module, daemon):
            for a in node.names:
                through(node.module, a.name, node.lineno)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            through(aliases[node.value.id], node.attr, node.lineno)
    return found


def test_no_re_export_shims(tmp_path: Path) -> None:
    """A name is imported from the module that defines it. A name kept where it once lived, so that
    old spellings still work, hides where it lives and holds two modules together: config.py
    re-exported Endpoint and the bounded reader for 41 call sites (review 0881ad4 §2.5, §2.8).
    Tests count as importers too: they reach the product as its other callers do."""
    found = [f for path in [*python_files(), *sorted((ROOT / "tests").glob("*.py"))] for f in reexports(path)]
    assert not found, "import each name from its home:\n" + "\n".join(found)
    tree = write_tree(tmp_path / "daemon", {
        "store/bounded.py": "def read_file(): ...\n",
        "config.py": "from genready.store.bounded import read_file as read_file\nfrom genready.store import bounded\n"
                     "from genready.store.bounded import read_file\n__all__ = ['read_file']\n"
                     "COPY = bounded.read_file\nMINE = bounded.read_file\nMINE()\n",
        "probe/container.py": "from genready import config\nfrom genready.config import read_file\n"
                              "config.read_file()\n"})
    assert reexports(tree / "genready" / "config.py", tree) == [
        "config.py:1: from genready.store.bounded import read_file as read_file (a re-export)",
        "config.py:4: __all__ names read_file (a re-export of genready.store.bounded)",
        "config.py:5: COPY = bounded.read_file (a copy of another's name)"]
    assert reexports(tree / "genready" / "probe" / "container.py", tree) == [
        "container.py:2: read_file through genready.config (import it from genready.store.bounded)",
        "container.py:3: read_file through genready.config (import it from genready.store.bounded)"]
