"""The package's layout rules (issue 12), checked on the source itself.

import-linter (`lint-imports`, run by .ci/test) enforces the layer contracts declared in
pyproject.toml; these tests add what its contracts cannot say: no import cycle anywhere, no
mixins, and no module reaching into another subpackage's private names.
"""

from __future__ import annotations

import ast
import pathlib

import grimp

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "kresilient"


def _modules() -> list[tuple[str, pathlib.Path]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out.append((".".join(parts), path))
    return out


def _subpackage(module: str) -> str:
    """The unit a private name may be shared within: a subpackage, or the top-level module."""
    parts = module.split(".")
    if len(parts) >= 2 and (PACKAGE / parts[1]).is_dir():
        return ".".join(parts[:2])
    return module


def _strongly_connected(graph: grimp.ImportGraph, ignore: str = "") -> list[list[str]]:
    """Tarjan's algorithm over the module graph (iterative; the graph is small)."""
    modules = sorted(m for m in graph.modules if m != ignore)
    edges = {
        m: iter(sorted(graph.find_modules_directly_imported_by(m) - {ignore})) for m in modules
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in modules:
        if root in index:
            continue
        work = [(root, edges[root])]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, edges[child]))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
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
    return found


def _root_imports(module: str, path: pathlib.Path) -> list[str]:
    """`from kresilient import Name` where Name is not a submodule: a re-export of the root."""
    found = []
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "kresilient":
            for alias in node.names:
                child = PACKAGE / alias.name
                if not (child.is_dir() or child.with_suffix(".py").is_file()):
                    found.append(f"{module}: from kresilient import {alias.name}")
    return found


def test_no_module_imports_the_root_package() -> None:
    # kresilient/__init__.py re-exports the public API; a module importing it back would
    # import every subpackage and make a cycle through the root.
    offenders = [line for module, path in _modules() for line in _root_imports(module, path)]
    assert not offenders, offenders


def test_no_import_cycle_inside_the_package() -> None:
    # Type-only imports count too: a cycle hidden behind TYPE_CHECKING is still a design cycle.
    graph = grimp.build_graph("kresilient", include_external_packages=False)
    cycles = _strongly_connected(graph, ignore="kresilient")
    assert not cycles, f"import cycles: {cycles}"


def test_a_cycle_is_detected() -> None:
    """Negative control for the cycle finder."""
    graph = grimp.ImportGraph()
    for name in ("a", "a.x", "a.y", "a.z"):
        graph.add_module(name)
    graph.add_import(importer="a.x", imported="a.y")
    graph.add_import(importer="a.y", imported="a.z")
    graph.add_import(importer="a.z", imported="a.x")
    assert _strongly_connected(graph) == [["a.x", "a.y", "a.z"]]


def test_no_mixins() -> None:
    offenders = []
    for module, path in _modules():
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Mixin"):
                offenders.append(f"{module}.{node.name}")
    assert not offenders, offenders


def _private_imports(module: str, path: pathlib.Path) -> list[str]:
    found = []
    package_of = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package_of.split(".")
            base = base[: len(base) - (node.level - 1)]
            source = ".".join([*base, *([node.module] if node.module else [])])
        else:
            source = node.module or ""
        if not source.startswith("kresilient"):
            continue
        for alias in node.names:
            target = f"{source}.{alias.name}"
            # A private name, or a public name reached through a private module.
            private_parts = [p for p in target.split(".")[1:] if p.startswith("_")]
            if not private_parts or alias.name.startswith("__"):
                continue
            # where the private thing lives: the first private component's parent unit
            parts = target.split(".")
            first = next(i for i, p in enumerate(parts) if p.startswith("_") and i > 0)
            home = _subpackage(
                ".".join(parts[:first]) if first > 1 else ".".join(parts[: first + 1])
            )
            # A private module at the top level (kresilient._catalog) is the package's own
            # shared leaf: its public names may be imported from anywhere in the package.
            top_level_leaf = first == 1 and (
                not alias.name.startswith("_") or target.count(".") == 1
            )
            if not top_level_leaf and _subpackage(module) != home:
                found.append(f"{module} imports {target}")
    return found


def test_no_module_reaches_into_another_units_private_names() -> None:
    offenders = [line for module, path in _modules() for line in _private_imports(module, path)]
    assert not offenders, "\n".join(offenders)


def test_private_import_check_catches_a_cross_package_reach(tmp_path: pathlib.Path) -> None:
    """Negative control for the private-name check."""
    src = tmp_path / "m.py"
    src.write_text(
        "from kresilient.producer._paths import x\nfrom kresilient.errors import _BY_CODE\n"
    )
    assert _private_imports("kresilient.consumer._consumer", src) == [
        "kresilient.consumer._consumer imports kresilient.producer._paths.x",
        "kresilient.consumer._consumer imports kresilient.errors._BY_CODE",
    ]
    assert _private_imports("kresilient.producer._producer", src) == [
        "kresilient.producer._producer imports kresilient.errors._BY_CODE",
    ]
    leaf = tmp_path / "leaf.py"
    leaf.write_text(
        "from kresilient._catalog import lookup\nfrom kresilient._catalog import _raw\n"
    )
    assert _private_imports("kresilient.lint.engine", leaf) == [
        "kresilient.lint.engine imports kresilient._catalog._raw",
    ]


def test_no_flat_feature_modules_remain() -> None:
    prefixes = ("_producer_", "_consumer_", "_telemetry_", "_spark_")
    flat = [p.name for p in PACKAGE.glob("*.py") if p.name.startswith(prefixes)]
    assert not flat, flat
