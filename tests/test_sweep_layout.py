"""The sweep package's layout: its map names every module, and the run and the report meet only at the files."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import genready.sweep

SWEEP = Path(genready.sweep.__file__).parent


def modules() -> list[str]:
    """Every module of the package, as the map names it: `files`, `run.runner`, `report.table`."""
    return sorted(".".join(p.relative_to(SWEEP).with_suffix("").parts) for p in SWEEP.rglob("*.py")
                  if p.stem != "__init__")


def mapped() -> list[str]:
    """The names the package map (sweep/__init__.py's docstring) gives a line each."""
    doc = genready.sweep.__doc__ or ""
    return [m.group(1) for m in re.finditer(r"^    ([a-z_.]+) {2,}\S", doc, re.M)]


def test_the_package_map_names_every_module_once() -> None:
    names = mapped()
    assert len(names) == len(set(names)), names
    assert set(modules()) - set(names) == set(), "modules missing from sweep/__init__.py's map"
    assert set(names) - set(modules()) == set(), "the map names modules that do not exist"


def test_the_map_check_fails_for_a_module_it_does_not_name() -> None:
    # The check above reads the real tree: a map without one line must show that module as missing.
    doc = genready.sweep.__doc__ or ""
    without = re.sub(r"^    run\.prune .*\n", "", doc, flags=re.M)
    assert without != doc
    names = [m.group(1) for m in re.finditer(r"^    ([a-z_.]+) {2,}\S", without, re.M)]
    assert set(modules()) - set(names) == {"run.prune"}


def imports_of(path: Path) -> set[str]:
    """The genready.sweep modules PATH imports, lazy ones included, as the map names them."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            found = [a.name for a in node.names]
        else:
            continue
        out |= {m.removeprefix("genready.sweep.") for m in found if m.startswith("genready.sweep.")}
    return out


def side(name: str) -> str:
    """run, report, or shared (a module at the package's top: files, rows, plan, ...)."""
    first = name.split(".")[0]
    return first if first in ("run", "report") else "shared"


def test_the_run_and_the_report_meet_only_at_the_shared_modules() -> None:
    # main (`genready sweep`) joins the two: it runs the loop, then renders its summary through the report; so does
    # replay (`sweep replay`): the report's schedule is what it runs, through main, and its verdict the report's.
    crossing = []
    for name in modules():
        mine = side(name)
        for dep in sorted(imports_of(SWEEP / (name.replace(".", "/") + ".py"))):
            theirs = side(dep)
            if name not in ("main", "replay") and theirs not in (mine, "shared"):
                crossing.append(f"{name} imports {dep}")
    assert not crossing, crossing
