"""The house rules, checked from the source: every module of the package and of benchmarks/ says what lives in it;
the modules import each other without loops (imports inside functions count too: a loop hidden in a function is
still a loop), so the package reads bottom-up; benchmarks/ is a package that edits no import path, its product
measurements apart from the lab and the GPU-check harness; and no file names a repository path that does not exist."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

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


# ---------------------------------------------------------------------------------------------------- benchmarks/
ROOT = PACKAGE.parent
BENCHMARKS = ROOT / "benchmarks"


def benchmark_modules() -> dict[str, Path]:
    """benchmarks' modules by dotted name (benchmarks, benchmarks.common, benchmarks.lab.plateau, ...)."""
    out = {}
    for p in sorted(BENCHMARKS.rglob("*.py")):
        parts = p.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def benchmark_imports(path: Path, modules: set[str]) -> set[str]:
    """The benchmarks modules `path` imports (inside functions too): `from benchmarks.lab import plateau` is
    benchmarks.lab.plateau, `from benchmarks import ROOT` is the package benchmarks."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "benchmarks":
            found.update(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                         for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "benchmarks")
    return found & modules


def test_every_benchmark_module_says_what_lives_in_it():
    modules = benchmark_modules()
    assert {"benchmarks", "benchmarks.common", "benchmarks.lab", "benchmarks.gpu_check",
            "benchmarks.gpu_check.suite"} <= modules.keys()
    missing = [name for name, p in modules.items() if not ast.get_docstring(ast.parse(p.read_text()))]
    assert not missing, f"benchmark modules without a docstring: {missing}"


def test_benchmarks_edit_no_import_path_and_stack_without_loops():
    """benchmarks is a package run as `python -m benchmarks.NAME`: nothing edits sys.path; the product's
    measurements import neither the lab nor the GPU-check harness, the harness does not import the lab, the package
    imports nothing of benchmarks; and the modules import each other without loops."""
    modules = benchmark_modules()
    edits = [f"{p.relative_to(ROOT)}:{node.lineno}"
             for p in modules.values() for node in ast.walk(ast.parse(p.read_text()))
             if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "path"
             and isinstance(node.value.value, ast.Name) and node.value.value.id == "sys"
             and node.attr in ("insert", "append", "extend", "remove")]
    assert not edits, f"sys.path edited in benchmarks/: {edits}"
    # a sibling imported by its bare name (`from common import ...`) works only where sys.path was edited
    stems = {name.rsplit(".", 1)[-1] for name in modules} - {"benchmarks"}
    bare = [f"{p.relative_to(ROOT)}:{node.lineno}"
            for p in modules.values() for node in ast.walk(ast.parse(p.read_text()))
            if (isinstance(node, ast.ImportFrom) and not node.level and node.module
                and node.module.split(".")[0] in stems)
            or (isinstance(node, ast.Import) and any(a.name.split(".")[0] in stems for a in node.names))]
    assert not bare, f"benchmarks modules imported by a bare name (write benchmarks.NAME): {bare}"
    graph = {name: benchmark_imports(p, set(modules)) - {name} for name, p in modules.items()}
    assert "benchmarks.common" in graph["benchmarks.throughput"]  # the graph sees real imports
    for name, deps in graph.items():
        if not name.startswith(("benchmarks.lab", "benchmarks.gpu_check")):
            assert not {d for d in deps if d.startswith(("benchmarks.lab", "benchmarks.gpu_check"))}, (name, deps)
        if name.startswith("benchmarks.gpu_check"):
            assert not {d for d in deps if d.startswith("benchmarks.lab")}, (name, deps)
    # a package's __init__ is imported by its modules by construction: leave those arrows out of the loop check
    cycle = find_cycle({n: {d for d in deps if not n.startswith(d + ".")} for n, deps in graph.items()})
    assert cycle is None, "import loop: " + " -> ".join(cycle)
    from_package = [p.name for p in PACKAGE.glob("*.py") if any(
        isinstance(n, (ast.Import, ast.ImportFrom)) and "benchmarks" in ast.unparse(n).split()[1].split(".")[:1]
        for n in ast.walk(ast.parse(p.read_text())))]
    assert not from_package, f"the package imports benchmarks: {from_package}"


# ---------------------------------------------------------------------------------------------------- references
REFERENCE = re.compile(r"(?<![\w./~$-])(?:tinyelectra|benchmarks|tests|recipes|\.ci)/[\w./+-]*")
LINK = re.compile(r"\]\(([^)\s]+)\)")
INSTALLED_AS = {"tinyelectra/recipes": "recipes"}  # pyproject.toml's package-dir: where an installed path comes from


def dead_references(text: str, folder: Path, markdown: bool = False) -> list[str]:
    """Repository paths named in `text` (a file in `folder`) that do not exist. A path starts at a top-level folder
    (tinyelectra/, benchmarks/, tests/, recipes/, .ci/) and is not part of a longer path or a URL; left out: one
    that runs into a placeholder (`results/<mode>-<stamp>/`, `throughput_{device}`, `glue_cpu*.json`) or has one
    (NAME, DIR: a segment in capitals), and what a usage line says a run will write (after "->", "--out" or
    "default"). In markdown, links are resolved from `folder`."""
    dead = []
    for m in REFERENCE.finditer(text):
        ref, after = m.group(0).rstrip(".,-"), text[m.end():m.end() + 1]
        before = text[text.rfind("\n", 0, m.start()) + 1:m.start()][-40:]
        if after and after in "<{*[$" or any(s.split(".")[0].isupper() for s in ref.split("/")) \
                or any(w in before for w in ("->", "--out", "default")):
            continue
        in_repo = next((source + ref[len(installed):] for installed, source in INSTALLED_AS.items()
                        if (ref + "/").startswith(installed + "/")), ref)
        if not (ROOT / in_repo).exists():
            dead.append(ref)
    for m in LINK.finditer(text) if markdown else ():
        target = m.group(1).split("#")[0]
        if target and not re.match(r"[a-z]+:", target) and not (folder / target).exists():
            dead.append(target)
    return dead


def test_dead_references_are_found_without_false_alarms(tmp_path):
    b, te = "benchmarks", "tinyelectra"  # spelled out below, this file would name the missing paths itself
    text = f"""See {b}/nope.py and tests/test_layout.py; `{b}/results/NAME.json`, `recipes/*.toml`,
    {b}/results/<mode>-<stamp>/, {b}/results/throughput_<device>.json, a URL
    https://github.com/google-research/electra/blob/master/tests/x.py, ../shared/data/glue/, runs/{te}/x,
    {te}/recipes/tiny.toml (installed), {te}/recipes/gone.toml, [notes](NOTES.md), [gone](results/x.md),
        python -m benchmarks.step_cpu -> {b}/results/step_cpu_new.json
    and {b}/gone/."""
    (tmp_path / "NOTES.md").write_text("")
    assert dead_references(text, tmp_path) == [f"{b}/nope.py", f"{te}/recipes/gone.toml", f"{b}/gone/"]
    assert dead_references(text, tmp_path, markdown=True)[3:] == ["results/x.md"]
    assert dead_references('STAGES["glue"](run)', tmp_path) == []  # code, not a markdown link


def checked_files() -> list[Path]:
    """The files a reader follows references in: tracked (or new, not ignored) text files, but not the records
    under a results/ or fixtures/ folder (their commands are as they ran, at the commit they name); their READMEs
    are checked."""
    try:
        names = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the files to check are the ones git tracks")
    out = []
    for name in names:
        p = ROOT / name
        record = {"results", "fixtures"} & set(p.parts) and p.name != "README.md"
        if p.is_file() and (p.suffix in (".py", ".md", ".toml", ".sh") or name == ".ci/run") and not record:
            out.append(p)
    return out


def test_no_reference_to_a_file_that_does_not_exist():
    """README.md, the benchmarks' READMEs and notes, code comments and docstrings, recipes: every repository path
    they name exists (a moved or retired file leaves no pointer behind)."""
    files = checked_files()
    assert ROOT / "README.md" in files and BENCHMARKS / "README.md" in files and PACKAGE / "runtime.py" in files
    dead = [f"{p.relative_to(ROOT)}: {ref}"
            for p in files for ref in dead_references(p.read_text(), p.parent, markdown=p.suffix == ".md")]
    assert not dead, "references to paths that do not exist:\n" + "\n".join(dead)
