"""The shape of the code base: no import cycle among farm's modules (imports inside functions included), each stage
importing only the stages docs/architecture.md's Layout table lists before it, a handful of modules at the top of
farm/, every other one in a stage's subpackage."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from farm.backends.registry import BACKENDS

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("farm", "tasks", "workers")
TOP_LEVEL_MODULES = {"__init__.py", "__main__.py", "artifact.py", "atomic.py", "defaults.py", "errors.py"}
ENTRY_POINTS = ("farm.__main__", "tasks", "workers")
"""Above every stage: `python -m farm` and the Celery app and worker the repo runs."""


def project_modules() -> dict[str, Path]:
    """Dotted name -> file of every module of the project (a package by its __init__.py)."""
    modules = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imported(node: ast.AST, modules: dict[str, Path]) -> set[str]:
    """The project modules an import statement names: `from a import b` is module a.b when that is a module,
    else a (the package whose attribute b is)."""
    names: list[str] = []
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
        names = [
            f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module
            for alias in node.names
        ]
    found = set()
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name:
            found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        graph[name] = {target for node in ast.walk(tree) for target in imported(node, modules)} - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_among_the_projects_modules() -> None:
    graph = import_graph()
    assert "farm.distributed.steps" in graph and "farm.build.assembly" in graph["farm.distributed.steps"]
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_farm_keeps_a_handful_of_modules_at_its_top() -> None:
    top = {path.name for path in (REPO / "farm").glob("*.py")}
    assert top == TOP_LEVEL_MODULES


def test_the_stages_are_subpackages() -> None:
    stages = {
        "ir",
        "frontend",
        "ops",
        "plan",
        "tuning",
        "backends",
        "build",
        "store",
        "runtime",
        "distributed",
        "cli",
        "tools",
    }
    assert {path.parent.name for path in (REPO / "farm").glob("*/__init__.py")} == stages


def test_celery_and_the_farm_protocol_stay_out_of_the_compiler() -> None:
    """The compile steps are pure functions: nothing below farm.distributed imports it or Celery."""
    graph = import_graph()
    below = [
        name
        for name in graph
        if name.startswith(
            (
                "farm.ir",
                "farm.ops",
                "farm.plan",
                "farm.backends",
                "farm.build",
                "farm.tuning",
                "farm.store",
                "farm.runtime",
            )
        )
    ]
    leaks = {
        name: sorted(t for t in graph[name] if t.startswith(("farm.distributed", "farm.cli", "tasks", "workers")))
        for name in below
    }
    assert {name: targets for name, targets in leaks.items() if targets} == {}


def documented_layers() -> list[list[str]]:
    """The module prefixes of each row of docs/architecture.md's Layout table, in its order (a row's backticked
    farm/ paths: `farm/ir/` is farm.ir, `farm/errors.py` farm.errors)."""
    text = (REPO / "docs" / "architecture.md").read_text()
    lines = text.split("\n## Layout\n", 1)[1].splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith("|"))
    end = next(index for index in range(start, len(lines)) if not lines[index].startswith("|"))
    layers = []
    for row in lines[start + 2 : end]:
        paths = re.findall(r"`(farm/[\w/]*?)(?:/|\.py)`", row.split("|")[1])
        layers.append([path.replace("/", ".") for path in paths])
    return layers


def layer_of(module: str, layers: list[list[str]]) -> int:
    """The index of the row `module` belongs to: the row with the longest prefix of it (`farm/backends/llvm/part.py`
    has a row of its own above `farm/backends/`); the farm package itself is the lowest, the entry points (len(layers))
    above them all."""
    if module == "farm":
        return 0
    rows = [
        (len(prefix), index)
        for index, prefixes in enumerate(layers)
        for prefix in prefixes
        if module == prefix or module.startswith(prefix + ".")
    ]
    if rows:
        return max(rows)[1]
    assert module.startswith(ENTRY_POINTS), f"{module} is in no row of docs/architecture.md's Layout table"
    return len(layers)


def layer_violations(graph: dict[str, set[str]], layers: list[list[str]]) -> list[str]:
    """Every import of a module from a later row than the importer's."""
    return sorted(
        f"{name} imports {target}"
        for name, targets in graph.items()
        for target in targets
        if layer_of(target, layers) > layer_of(name, layers)
    )


def test_each_stage_imports_only_the_stages_the_docs_list_before_it() -> None:
    layers = documented_layers()
    assert ["farm.ir"] in layers and layers.index(["farm.ir"]) < layers.index(["farm.runtime"])
    assert layer_violations(import_graph(), layers) == []


def test_a_backends_part_and_loader_sit_above_the_cores_that_find_them_by_name() -> None:
    layers = documented_layers()
    for backend in BACKENDS.values():
        part, loader = layer_of(f"{backend.package}.part", layers), layer_of(f"{backend.package}.loader", layers)
        assert layer_of(backend.package, layers) < layer_of("farm.build.parts", layers) < part
        assert part < layer_of("farm.build.assembly", layers)
        assert layer_of("farm.runtime", layers) < loader < layer_of("farm.distributed", layers)


def test_a_module_belongs_to_the_row_of_its_longest_prefix() -> None:
    layers = [["farm.backends"], ["farm.build.parts"], ["farm.backends.llvm.part"], ["farm.build"]]
    assert [
        layer_of(m, layers) for m in ("farm.backends.llvm.kernel", "farm.backends.llvm.part", "farm.build.local")
    ] == [
        0,
        2,
        3,
    ]


def test_the_layer_check_finds_an_upward_import() -> None:
    layers = [["farm.errors"], ["farm.backends"], ["farm.runtime"]]
    graph = {
        "farm.backends.llvm.link": {"farm.runtime.elf", "farm.errors"},
        "farm.runtime.elf": {"farm"},
        "workers.main": {"farm.runtime"},
    }
    assert layer_violations(graph, layers) == ["farm.backends.llvm.link imports farm.runtime.elf"]


MAX_MODULE_LINES = 700
"""The most lines a farm module may have: past it a module holds several things."""


def test_no_module_grows_past_the_cap() -> None:
    lines = {str(path.relative_to(REPO)): len(path.read_text().splitlines()) for path in (REPO / "farm").rglob("*.py")}
    over = {name: count for name, count in lines.items() if count > MAX_MODULE_LINES}
    assert not over, f"modules over {MAX_MODULE_LINES} lines (split them): {over}"
