"""No import circles between flashlane's top-level packages and modules (DESIGN.md section 2).

Every `import flashlane.X` and `from flashlane.X ... import` counts, at module level or inside a
function: an import hidden in a function is still a dependency, only a later one.
"""

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "flashlane"
# Circles known and owned, each with the change that ends it; an entry that no longer matches
# a circle fails the test too, so the list only shrinks.
KNOWN_CIRCLES: set[frozenset] = set()  # none left (issue 35)


def _unit(path: Path) -> str:
    """The top-level package or module a file belongs to: `kernels`, `engine`, `__init__`."""
    relative = path.relative_to(PACKAGE)
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def _imported_units(source: str, path: Path) -> set[str]:
    """The top-level flashlane units that `source` (the file at `path`) imports, relative
    imports resolved."""
    tree = ast.parse(source, filename=str(path))
    package_parts = ("flashlane", *path.relative_to(PACKAGE).parent.parts)
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package_parts[: len(package_parts) - node.level + 1]
                module = ".".join((*base, *([node.module] if node.module else [])))
            else:
                module = node.module or ""
            if module == "flashlane":
                # `from flashlane import kernels` imports the unit `kernels`
                names += [f"flashlane.{alias.name}" for alias in node.names]
            else:
                names.append(module)
    units = set()
    for name in names:
        parts = name.split(".")
        # `flashlane.__version__`, `flashlane.LLM`: the package root, which every submodule's
        # import runs anyway, is no unit of the graph
        if parts[0] == "flashlane" and len(parts) > 1 and _is_unit(parts[1]):
            units.add(parts[1])
    return units


def _is_unit(name: str) -> bool:
    return (PACKAGE / name).is_dir() or (PACKAGE / f"{name}.py").is_file()


def import_edges() -> dict[tuple[str, str], list[str]]:
    """(importer unit, imported unit) -> the importing files, relative to the repository."""
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        source = _unit(path)
        for target in _imported_units(path.read_text(), path):
            if target != source:
                edges[(source, target)].append(str(path.relative_to(PACKAGE.parent)))
    return edges


def _cycles(edges) -> list[list[str]]:
    """The strongly connected components with more than one unit (Tarjan)."""
    graph = defaultdict(set)
    for source, target in edges:
        graph[source].add(target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(unit: str) -> None:
        index[unit] = low[unit] = len(index)
        stack.append(unit)
        on_stack.add(unit)
        for neighbour in sorted(graph[unit]):
            if neighbour not in index:
                visit(neighbour)
                low[unit] = min(low[unit], low[neighbour])
            elif neighbour in on_stack:
                low[unit] = min(low[unit], index[neighbour])
        if low[unit] == index[unit]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == unit:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for unit in sorted(graph):
        if unit not in index:
            visit(unit)
    return found


def test_no_import_circles_between_packages():
    edges = import_edges()
    assert len(edges) > 20, "the scan found almost no imports: is the package path right?"
    found = _cycles(edges)
    report = [
        f"known circle {' <-> '.join(sorted(known))} is gone: drop it from KNOWN_CIRCLES"
        for known in KNOWN_CIRCLES
        if known not in {frozenset(c) for c in found}
    ]
    for component in found:
        members = set(component)
        if members in KNOWN_CIRCLES:
            continue
        report.append("circle: " + " <-> ".join(component))
        for (source, target), files in sorted(edges.items()):
            if source in members and target in members:
                report.append(f"  {source} -> {target}: {', '.join(files)}")
    assert not report, "\n".join(report)


def test_the_scan_sees_a_circle():
    edges = {("a", "b"): ["a.py"], ("b", "c"): ["b.py"], ("c", "a"): ["c.py"], ("c", "d"): []}
    assert _cycles(edges) == [["a", "b", "c"]]


def test_the_scan_reads_imports_inside_functions_and_relative_ones():
    source = (
        "import os\n"
        "from . import windows\n"
        "from ..sessions.slots import x\n"
        "from flashlane import request, __version__\n"
        "def f():\n"
        "    from flashlane.kernels.tables import y\n"
        "    import flashlane.models.state\n"
    )
    path = PACKAGE / "lanes" / "probe.py"
    assert _unit(path) == "lanes"
    assert _imported_units(source, path) == {"lanes", "sessions", "request", "kernels", "models"}
