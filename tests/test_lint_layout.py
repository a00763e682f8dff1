"""The lint package's import structure (issue 12): no import cycle among its modules, no
import hidden inside a function to dodge one, and no module reaching into another module's
``_private`` names."""

from __future__ import annotations

import ast
from pathlib import Path

import kresilient.lint

LINT = Path(kresilient.lint.__file__).parent
PREFIX = "kresilient.lint."


def _modules() -> dict[str, ast.Module]:
    return {p.stem: ast.parse(p.read_text(), str(p)) for p in sorted(LINT.glob("*.py"))}


def _lint_imports(node: ast.AST) -> list[ast.ImportFrom]:
    return [
        n
        for n in ast.walk(node)
        if isinstance(n, ast.ImportFrom) and (n.module or "").startswith(PREFIX)
    ]


def test_no_import_cycle_between_lint_modules() -> None:
    graph = {
        name: {imp.module[len(PREFIX) :] for imp in _lint_imports(tree) if imp.module}
        for name, tree in _modules().items()
    }
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"import cycle: {' -> '.join((*path, name))}"
        if name in done:
            return
        for dep in sorted(graph.get(name, ())):
            visit(dep, (*path, name))
        done.add(name)

    for name in graph:
        visit(name, ())


#: The one deliberate exception: ``cli`` builds the ``lint``/``audit`` parsers from the
#: standard library alone and imports the commands' module only when a command runs, so
#: ``kresilient lint --help`` stays quick (issue 36). It imports nothing else inside functions.
LAZY = {"cli": {"kresilient.lint._commands"}}


def test_lint_modules_import_each_other_at_module_level_only() -> None:
    for name, tree in _modules().items():
        for func in ast.walk(tree):
            if isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
                allowed = LAZY.get(name, set())
                inner = [i.module for i in _lint_imports(func) if i.module not in allowed]
                assert not inner, f"{name}.{func.name} imports {inner} inside the function"


def test_no_private_name_is_imported_from_another_lint_module() -> None:
    for name, tree in _modules().items():
        for imp in _lint_imports(tree):
            private = [a.name for a in imp.names if a.name.startswith("_")]
            assert not private, f"{name} imports {private} from {imp.module}"
