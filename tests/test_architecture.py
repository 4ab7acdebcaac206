"""The package map holds: no import cycles among postrl's modules, and functions stay short.

The layer rules themselves are import-linter contracts in pyproject.toml (`lint-imports`, run by
`make test`). This file adds what import-linter does not see: importing `a.b.c` runs `a/__init__.py`
and `a/b/__init__.py` too, so a package whose `__init__` imports its submodules can close a cycle
that no single `import` line shows.
"""

from __future__ import annotations

import ast
from pathlib import Path

import postrl

PACKAGE = Path(postrl.__file__).parent
MAX_FUNCTION_LINES = 60


# ---- the import graph ----------------------------------------------------------------------------


def module_names(root: Path) -> dict[str, Path]:
    """Dotted name -> file, for every module of the package at `root` (a package is its __init__)."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _is_type_checking(test: ast.expr) -> bool:
    """`if TYPE_CHECKING:` or `if typing.TYPE_CHECKING:`."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported_names(tree: ast.Module, module: str, is_package: bool) -> set[str]:
    """Every dotted name `module` imports (lazy imports inside functions too), except under
    `if TYPE_CHECKING:`; relative imports resolved; `from p import n` yields `p` and `p.n`."""
    names: set[str] = set()

    class Visitor(ast.NodeVisitor):
        def visit_If(self, node: ast.If) -> None:
            if not _is_type_checking(node.test):
                self.generic_visit(node)
                return
            for child in node.orelse:  # the else branch does run
                self.visit(child)

        def visit_Import(self, node: ast.Import) -> None:
            names.update(alias.name for alias in node.names)

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                anchor = package[: len(package) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)

    Visitor().visit(tree)
    return names


def _modules_run_by(name: str, modules: dict[str, Path]) -> set[str]:
    """Importing `a.b.c` runs `a`, `a.b` and `a.b.c`: those of them that are our modules."""
    parts = name.split(".")
    return {prefix for i in range(1, len(parts) + 1) if (prefix := ".".join(parts[:i])) in modules}


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the package's modules that importing it runs directly (not transitively).
    For `from p import n`, `p.n` counts only when it is a module (not a name defined in `p`),
    and then so do its parents, which `p` already brings."""
    modules = module_names(root)
    graph = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        deps: set[str] = set()
        for name in imported_names(tree, module, path.name == "__init__.py"):
            deps |= _modules_run_by(name, modules)
        deps.discard(module)
        graph[module] = deps
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (no recursion limit): the components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        work = [(start, iter(sorted(graph[start])))]
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return sorted(found, key=lambda c: (-len(c), c))


def describe_cycles(graph: dict[str, set[str]], cycles: list[list[str]]) -> str:
    lines = [f"{sum(map(len, cycles))} modules in {len(cycles)} import cycle(s):"]
    for component in cycles:
        members = set(component)
        lines.append(f"\n{len(component)} modules: {', '.join(component)}")
        lines += [f"  {m} -> {', '.join(sorted(graph[m] & members))}" for m in component]
    return "\n".join(lines)


def test_no_import_cycles():
    graph = import_graph(PACKAGE)
    cycles = strongly_connected(graph)
    assert not cycles, describe_cycles(graph, cycles)


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


def test_cycle_checker_finds_what_it_should(tmp_path):
    package = _write(tmp_path, {
        "pkg/__init__.py": "",
        # a two-module cycle, closed by a lazy relative import
        "pkg/a.py": "import pkg.b\n",
        "pkg/b.py": "def f():\n    from . import a\n",
        # a TYPE_CHECKING-only import does not count (its else branch does)
        "pkg/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import d\nelse:\n    import os\n",
        "pkg/d.py": "from pkg.c import x\n",
        # importing pkg.sub.y runs pkg/sub/__init__.py, which imports pkg.sub.x, which imports pkg.e
        "pkg/sub/__init__.py": "from pkg.sub import x\n",
        "pkg/sub/x.py": "from pkg import e\n",
        "pkg/sub/y.py": "",
        "pkg/e.py": "from .sub.y import thing\n",
    })
    graph = import_graph(package)
    assert graph["pkg.c"] == set() and graph["pkg.d"] == {"pkg", "pkg.c"}
    assert graph["pkg.e"] == {"pkg", "pkg.sub", "pkg.sub.y"}
    assert strongly_connected(graph) == [["pkg.e", "pkg.sub", "pkg.sub.x"], ["pkg.a", "pkg.b"]]
    message = describe_cycles(graph, strongly_connected(graph))
    assert "pkg.a -> pkg.b" in message and "pkg.sub.x -> pkg.e" in message


# ---- small units ---------------------------------------------------------------------------------


def long_functions(root: Path, limit: int) -> list[str]:
    """`path:line name (N lines)` for every function or method longer than `limit` lines,
    counted from the `def` line (decorators excluded) to its last line."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > limit:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_functions_are_short():
    offenders = long_functions(PACKAGE, MAX_FUNCTION_LINES)
    assert not offenders, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(offenders)


def test_function_length_counts_from_def_to_last_line(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(59))
    (tmp_path / "m.py").write_text(f"@decorator\n\n\ndef ok():\n{body}\n\n\ndef too_long():\n{body}\n    x = 0\n")
    assert long_functions(tmp_path, 60) == [f"{tmp_path.name}/m.py:66 too_long (61 lines)"]
