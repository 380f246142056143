"""No import cycle between our packages, nor between the modules of one package.

The graph is grimp's, the one import-linter checks its contracts on (pyproject.toml). grimp
reads every import statement of a module: at the top, inside a function, under
``if TYPE_CHECKING``. An import moved into a function so that a cycle goes unnoticed at
start-up is therefore still an edge here, and still a cycle: a lower layer that needs
something from above takes it as a parameter.
"""

from __future__ import annotations

import textwrap

import grimp
import pytest

PACKAGES = ("core", "cases", "reviews", "effects", "engine", "workflow", "audit", "workplace", "api", "decisionflow")


def module_imports(graph) -> dict[str, set[str]]:
    """Each module of the graph and the modules of the graph it imports."""
    return {module: set(graph.find_modules_directly_imported_by(module)) for module in graph.modules}


def package_imports(imports: dict[str, set[str]]) -> dict[str, set[str]]:
    """The same edges between top-level packages; a package's imports of itself left out."""
    found: dict[str, set[str]] = {}
    for importer, imported in imports.items():
        package = importer.split(".")[0]
        found.setdefault(package, set()).update(m.split(".")[0] for m in imported)
        found[package].discard(package)
    return found


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every set of nodes that reach each other (Tarjan's strongly connected components, of
    two or more nodes, or one that imports itself), each sorted, the list sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        # An explicit stack of (node, the neighbours still to visit): the graph is deep
        # enough that recursion would be a risk, and this keeps the order deterministic.
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, neighbours = work[-1]
            for nxt in neighbours:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(edges.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1 or node in edges.get(node, ()):
                        found.append(sorted(component))
    return sorted(found)


def shortest_loop(edges: dict[str, set[str]], start: str, members: set[str]) -> list[str]:
    """A shortest way from ``start`` back to it through ``members`` (breadth first)."""
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt_frontier = []
        for node in frontier:
            for nxt in sorted(edges.get(node, ())):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if nxt in members and nxt not in came_from:
                    came_from[nxt] = node
                    nxt_frontier.append(nxt)
        frontier = nxt_frontier
    return [start]


def shown(graph, component: list[str], imports: dict[str, set[str]]) -> str:
    """One loop of ``component`` (packages or modules) and, per step, the import statements
    that make it, with their lines: what to move to break it."""
    members = set(component)

    def node(module: str) -> str:
        return module if module in members else module.split(".")[0]

    edges: dict[str, set[str]] = {}
    for importer, imported in imports.items():
        for target in imported:
            if node(importer) in members and node(target) in members and node(importer) != node(target):
                edges.setdefault(node(importer), set()).add(node(target))
    if any(node(m) == m for m in component) and len(component) == 1:
        edges.setdefault(component[0], set()).add(component[0])
    loop = min((shortest_loop(edges, start, members) for start in component), key=len)
    lines = [f"{' -> '.join(loop)} (of the cycle {', '.join(component)}):"]
    for a, b in zip(loop, loop[1:], strict=False):
        statements = [
            f"  {importer}:{detail['line_number']}: {detail['line_contents']}"
            for importer in sorted(imports)
            if node(importer) == a
            for imported in sorted(imports[importer])
            if node(imported) == b
            for detail in graph.get_import_details(importer=importer, imported=imported)
        ]
        lines += statements[:3] + ([f"  ... and {len(statements) - 3} more"] if len(statements) > 3 else [])
    return "\n".join(lines)


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph(*PACKAGES, cache_dir=None)


def test_no_import_cycle_between_our_packages(graph):
    imports = module_imports(graph)
    found = cycles(package_imports(imports))
    assert not found, "import cycles between packages:\n" + "\n".join(shown(graph, c, imports) for c in found)


def test_no_import_cycle_between_the_modules_of_a_package(graph):
    imports = module_imports(graph)
    found = cycles(imports)
    assert not found, "import cycles between modules:\n" + "\n".join(shown(graph, c, imports) for c in found)


def test_the_ground_floor_imports_nothing_of_ours_above_it(graph):
    # Also a contract in pyproject.toml; said here where the cycles are, for `pytest` alone.
    assert package_imports(module_imports(graph)).get("core", set()) == set()


def test_the_detector_finds_cycles_of_every_length():
    assert cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"a"}}) == [["a"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c"}}) == [["a", "b"], ["c", "d"]]


def test_a_cycle_made_by_an_import_inside_a_function_fails(tmp_path, monkeypatch):
    """Planted: a lower package that imports the higher one inside a function, the way a
    deferred import hides a cycle from Python at start-up."""
    low, high = tmp_path / "plantedlow", tmp_path / "plantedhigh"
    low.mkdir()
    high.mkdir()
    (low / "__init__.py").write_text("")
    (high / "__init__.py").write_text("")
    (low / "models.py").write_text(
        textwrap.dedent(
            """
            def label(pk):
                from plantedhigh.views import page

                return page(pk)
            """
        )
    )
    (high / "views.py").write_text("from plantedlow import models\n\n\ndef page(pk):\n    return models\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    planted = grimp.build_graph("plantedlow", "plantedhigh", cache_dir=None)
    imports = module_imports(planted)
    found = cycles(package_imports(imports))
    assert found == [["plantedhigh", "plantedlow"]]
    assert "plantedlow.models:3: from plantedhigh.views import page" in shown(planted, found[0], imports)
    assert cycles(imports) == [["plantedhigh.views", "plantedlow.models"]]
