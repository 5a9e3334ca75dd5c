"""Module and function sizes of the product (daemon/genready): lines per module, the largest
functions, and how many exceed a size. Run on any checkout: `python3 bench/sizes.py [ROOT]`."""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def sizes(root: Path) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    pkg = root / "daemon" / "genready"
    modules, functions = [], []
    for path in sorted(pkg.rglob("*.py")):
        rel = str(path.relative_to(pkg))
        text = path.read_text()
        modules.append((len(text.splitlines()), rel))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None:
                functions.append((node.end_lineno - node.lineno + 1, f"{rel}:{node.name}"))
    return sorted(modules, reverse=True), sorted(functions, reverse=True)


def main() -> None:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1]
    modules, functions = sizes(root)
    total = sum(n for n, _ in modules)
    print(f"{len(modules)} modules, {total} lines; {len(functions)} functions")
    print("largest modules:")
    for n, name in modules[:12]:
        print(f"  {n:5d}  {name}")
    print("largest functions:")
    for n, name in functions[:12]:
        print(f"  {n:5d}  {name}")
    for limit in (50, 80, 120):
        print(f"functions over {limit} lines: {sum(1 for n, _ in functions if n > limit)}")


if __name__ == "__main__":
    main()
