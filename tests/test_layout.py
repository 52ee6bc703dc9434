"""The package's house rules, checked from the source: every module says what lives in it, and the modules import
each other without loops (imports inside functions count too: a loop hidden in a function is still a loop), so the
package reads bottom-up."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tinyelectra"


def import_graph() -> dict[str, set[str]]:
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for name in modules:
        deps: set[str] = set()
        for node in ast.walk(ast.parse((PACKAGE / f"{name}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "tinyelectra":
                parts = node.module.split(".")[1:]
                deps.update(parts[:1] if parts else (a.name for a in node.names))
            elif isinstance(node, ast.ImportFrom) and node.level:
                deps.update([node.module.split(".")[0]] if node.module else (a.name for a in node.names))
            elif isinstance(node, ast.Import):
                deps.update(a.name.split(".")[1] for a in node.names if a.name.startswith("tinyelectra."))
        graph[name] = (deps & modules) - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return path[path.index(dep):] + [dep]
            if dep not in state and (found := visit(dep)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_find_cycle_sees_a_loop_through_three_modules():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_import_loops_in_the_package():
    graph = import_graph()
    assert {"train", "budget", "flops", "console", "logs"} <= graph.keys()
    assert "config" in graph["flops"]  # the graph sees real imports
    cycle = find_cycle(graph)
    assert cycle is None, "import loop: " + " -> ".join(cycle)


def test_every_module_says_what_lives_in_it():
    missing = [p.name for p in sorted(PACKAGE.glob("*.py"))
               if p.name != "__main__.py" and not ast.get_docstring(ast.parse(p.read_text()))]
    assert not missing, f"modules without a docstring: {missing}"
