"""The architecture, enforced: which part of minipar may import which, no import cycles, no
function-local imports, and nothing that cites a file outside the repository.

The rules are the data just below. The checkers are pure functions over an import graph
(module -> {imported module: line}) built with `ast` from the source, never by importing
it; each is first shown to report a forbidden edge, a cycle, a local import and an outside
citation on small synthetic inputs, then run over the real tree, which must be clean.
"""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Mapping, Optional, Union

# ---- the rules ------------------------------------------------------------------------
FORMS = ("minipar.parallel.dp", "minipar.parallel.tp", "minipar.parallel.pp",
         "minipar.parallel.cp", "minipar.parallel.ep")
CORE = ("minipar.runtime", "minipar.nn", "minipar.optim", "minipar.data")
LIBRARY = CORE + FORMS + ("minipar", "minipar.files", "minipar.plan", "minipar.viz",
                          "minipar.parallel", "minipar.parallel.mesh", "minipar.parallel.checkpoint")
SIBLINGS = ("a parallel form never imports a sibling form: what crosses forms is answered "
            "in minipar.parallel.mesh and passed in")
# Pipeline schedules are plain data: the planner times them at full scale and the drawings
# draw them, so these modules of parallel/pp import nothing of minipar but each other (no
# communication, no model). plan and viz import them by module, never the package
# minipar.parallel.pp, which also holds the runner that communicates.
PP_DATA = tuple(f"minipar.parallel.pp.{m}"
                for m in ("actions", "schedules", "zero_bubble", "dualpipe", "validate",
                          "lowering", "dry_run"))

# component -> (what it may import besides itself, the rule in words). A component is a
# package or module and everything under it, except the INIT_ONLY ones: their __init__ alone.
RULES: dict[str, tuple[tuple[str, ...], str]] = {
    "minipar.runtime": ((), "the simulated cluster imports no other minipar package"),
    "minipar.nn": (("minipar.runtime",), "the single-device model stands on the runtime alone"),
    "minipar.optim": (("minipar.runtime", "minipar.nn.parameter"),
                      "an optimizer sees Parameters (minipar.nn.parameter), never a model"),
    "minipar.data": (("minipar.runtime",), "data knows tokens and batches, nothing of models"),
    "minipar.files": (("minipar.runtime",), "the file format knows arrays and JSON only"),
    "minipar.plan": (("minipar.runtime",) + PP_DATA,
                     "the formulas take plain numbers and schedules, not a GPTConfig"),
    "minipar.viz": (("minipar.runtime",) + PP_DATA,
                    "drawings read runtime records and schedules only"),
    **{form: (CORE, SIBLINGS) for form in FORMS},
    "minipar.parallel.pp": (CORE + PP_DATA, SIBLINGS),  # its runner executes its schedules
    **{m: (PP_DATA, "a pipeline schedule is plain data: no communication, no model, so "
                    "plan and viz may import it") for m in PP_DATA},
    "minipar.parallel.mesh": (CORE + FORMS, "the composition home may import every form"),
    "minipar.parallel.checkpoint": (CORE + FORMS + ("minipar.files",),
                                    "checkpoints meet the forms and the file format only"),
    "minipar.parallel": (FORMS + ("minipar.parallel.mesh", "minipar.parallel.checkpoint"),
                         "the package re-exports what is beneath it"),
    "minipar.course": (LIBRARY, "the course never imports programs or the command line"),
    "minipar.programs": (LIBRARY + ("minipar.course",),
                         "programs may import all but the command line, which runs them"),
    "minipar.cli": (LIBRARY + ("minipar.course", "minipar.programs"), "the command runs all"),
    "minipar.__main__": (("minipar.cli",), "python -m minipar is the command"),
    "minipar": (("minipar.runtime",), "the package re-exports the runtime"),
}
INIT_ONLY = ("minipar", "minipar.parallel")
OPTIONAL = ("mpi4py", "matplotlib")  # imported inside a function, where needed, as are
# the minipar modules that import one at their top (runtime/backends/mpi.py)
OUTSIDE = {  # what the project once cited from outside the repository
    r"\.\./shared\b": "../shared is outside the repository",
    r"\bDESIGN\.md\b": "DESIGN.md is not part of the repository: state the rule where it applies",
    r"\bthe seeds\b|\bseeds'|\bseeds/": "the seeds are not part of the repository: "
                                       "describe the case itself, or cite a paper",
}

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "minipar"
Graph = Mapping[str, Union[Mapping[str, Optional[int]], Iterable[str]]]


# ---- reading imports with ast ---------------------------------------------------------
@dataclass(frozen=True)
class Import:
    target: str     # the module imported, resolved: "minipar.runtime.context", "numpy"
    line: int
    local: bool     # inside a function: runs at call time, not at import
    dynamic: bool = False  # importlib.import_module / __import__: hidden from these rules


def parse_imports(source: str, module: str, is_package: bool = False,
                  modules: Iterable[str] = ()) -> list[Import]:
    """Every import of `source` (module `module`), resolved against the known `modules`:
    `from a import b` imports a.b when that is a module, else a."""
    modules = set(modules)
    package = module if is_package else module.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, local: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend(Import(a.name, node.lineno, local) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                found.append(Import(sub if sub in modules else base, node.lineno, local))
        elif isinstance(node, ast.Call) and _is_dynamic_import(node.func):
            arg = node.args[0] if node.args else None
            name = arg.value if isinstance(arg, ast.Constant) else "<computed name>"
            found.append(Import(str(name), node.lineno, local, dynamic=True))
        inner = local or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(ast.parse(source), False)
    return found


def _is_dynamic_import(func: ast.AST) -> bool:
    if isinstance(func, ast.Attribute):
        return func.attr == "import_module"
    return isinstance(func, ast.Name) and func.id in ("import_module", "__import__")


def _internal(name: str) -> bool:
    return name == "minipar" or name.startswith("minipar.")


def import_graph(imports: Mapping[str, list[Import]]) -> dict[str, dict[str, int]]:
    """module -> {minipar module it imports: first line}, function-local ones included."""
    graph: dict[str, dict[str, int]] = {}
    for module, found in imports.items():
        edges = graph.setdefault(module, {})
        for imp in found:
            if _internal(imp.target) and not imp.dynamic:
                edges.setdefault(imp.target, imp.line)
    return graph


# ---- the checkers: pure functions ------------------------------------------------------
def _covers(entry: str, module: str) -> bool:
    return module == entry or (entry not in INIT_ONLY and module.startswith(entry + "."))


def component_of(module: str, rules=RULES) -> Optional[str]:
    """The component a module belongs to: the longest key of `rules` covering it."""
    keys = [k for k in rules if _covers(k, module)]
    return max(keys, key=len) if keys else None


def _edges(graph: Graph, module: str) -> dict[str, Optional[int]]:
    targets = graph[module]
    return dict(targets) if isinstance(targets, Mapping) else dict.fromkeys(targets)


def layering_errors(graph: Graph, rules=RULES) -> list[str]:
    """One message per import a component may not make, and per module in no component."""
    errors = []
    for module in sorted(graph):
        component = component_of(module, rules)
        if component is None:
            errors.append(f"{module} belongs to no component of RULES: add its package to "
                          f"RULES in tests/test_architecture.py with what it may import")
            continue
        allowed, why = rules[component]
        for target, line in sorted(_edges(graph, module).items()):
            if component_of(target, rules) == component or any(_covers(a, target) for a in allowed):
                continue
            where = f"{module} (line {line})" if line else module
            errors.append(f"{where} imports {target}, which {component} may not: {why} "
                          f"({component} may import {', '.join(allowed) or 'no other minipar package'})")
    return errors


def cycle_errors(graph: Graph) -> list[str]:
    """One message per strongly connected set of modules, naming one cycle through it."""
    nodes = sorted(set(graph) | {t for m in graph for t in _edges(graph, m)})
    succ = {n: sorted(_edges(graph, n)) if n in graph else [] for n in nodes}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def strongconnect(v: str) -> None:  # Tarjan (1972)
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in succ[v]:
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                scc.append(w)
                if w == v:
                    break
            components.append(sorted(scc))

    for v in nodes:
        if v not in index:
            strongconnect(v)
    errors = []
    for scc in sorted(components):
        if len(scc) == 1 and scc[0] not in succ[scc[0]]:
            continue
        path = _cycle_through(scc[0], set(scc), succ)
        errors.append(f"import cycle: {' -> '.join(path)}; break it by moving what both "
                      f"sides need into a module of its own")
    return errors


def _cycle_through(start: str, members: set[str], succ: dict[str, list[str]]) -> list[str]:
    """The shortest path start -> ... -> start inside one strongly connected set."""
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in succ[v]:
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [start] + path[::-1][1:] + [start] if v != start else [start, start]
                if w in members and w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{start} is on no cycle")  # pragma: no cover


def local_import_errors(imports: Mapping[str, list[Import]], optional=OPTIONAL) -> list[str]:
    """One message per import inside a function (or dynamic one) of anything but an optional
    dependency, or a minipar module that imports one at its top (it needs it to load)."""
    needs = set(optional)
    changed = True
    while changed:  # modules that import an optional dependency at their top, transitively
        changed = False
        for module, found in imports.items():
            if module not in needs and any(
                    not i.local and (i.target in needs or i.target.split(".")[0] in optional)
                    for i in found):
                needs.add(module)
                changed = True
    errors = []
    for module in sorted(imports):
        for imp in imports[module]:
            if not (imp.local or imp.dynamic):
                continue
            if imp.target in needs or imp.target.split(".")[0] in optional:
                continue
            if imp.dynamic:
                errors.append(f"{module} (line {imp.line}) imports {imp.target} by name at run "
                              f"time, hidden from the import rules: import it at the top")
            else:
                errors.append(f"{module} (line {imp.line}) imports {imp.target} inside a "
                              f"function: move it to the top (only optional dependencies, "
                              f"{', '.join(optional)}, are imported where they are used)")
    return errors


def outside_citation_errors(path: str, text: str, root: Path = ROOT) -> list[str]:
    """One message per citation in `text` (the file `path`, relative to `root`) of a file
    outside the repository: a known outside source, or a Markdown link leaving the root."""
    errors = []
    for pattern, why in OUTSIDE.items():
        for m in re.finditer(pattern, text):
            errors.append(f"{path}:{text.count(chr(10), 0, m.start()) + 1} cites "
                          f"{m.group(0)!r}: {why}")
    if path.endswith(".md"):
        for m in re.finditer(r"\[[^\]]*\]\(([^)\s]+)\)", text):
            target = m.group(1).split("#")[0]
            if not target or re.match(r"[a-z]+:", target):
                continue  # an anchor in the page, or a URL
            resolved = Path(os.path.normpath(root / Path(path).parent / target))
            line = text.count("\n", 0, m.start()) + 1
            if resolved != root and root not in resolved.parents:
                errors.append(f"{path}:{line} links to {target}, outside the repository")
            elif not resolved.exists():
                errors.append(f"{path}:{line} links to {target}, which does not exist")
    return errors


# ---- the real tree ----------------------------------------------------------------------
def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@lru_cache(maxsize=None)
def tree_imports() -> dict[str, list[Import]]:
    files = sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)
    modules = {module_name(p) for p in files}
    return {module_name(p): parse_imports(p.read_text(encoding="utf-8"), module_name(p),
                                          p.name == "__init__.py", modules) for p in files}


def cited_texts() -> dict[str, str]:
    """Every module, doc, lesson, test and benchmark, by path relative to the root."""
    paths = [ROOT / "README.md"] + [p for d in ("minipar", "docs", "lessons", "tests", "benchmarks")
                                    for p in sorted((ROOT / d).rglob("*"))
                                    if p.suffix in (".py", ".md") and "__pycache__" not in p.parts]
    return {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in paths
            if p.resolve() != Path(__file__).resolve()}


# ---- the checkers catch what they must ---------------------------------------------------
def test_a_model_importing_a_parallel_form_is_reported():
    errors = layering_errors({"minipar.nn.gpt": {"minipar.parallel.tp.layers": 7}})
    assert errors == [
        "minipar.nn.gpt (line 7) imports minipar.parallel.tp.layers, which minipar.nn may not: "
        "the single-device model stands on the runtime alone "
        "(minipar.nn may import minipar.runtime)"]


def test_a_form_importing_a_sibling_form_is_reported():
    graph = {"minipar.parallel.dp.engine": {"minipar.parallel.tp.layers": 3,
                                            "minipar.parallel": 4, "minipar.nn.parameter": 5},
             "minipar.parallel.pp.schedule": ["minipar.parallel.mesh.dims"]}
    errors = layering_errors(graph)
    assert len(errors) == 3
    assert errors[0].startswith("minipar.parallel.dp.engine (line 4) imports minipar.parallel,")
    assert errors[1].startswith(
        "minipar.parallel.dp.engine (line 3) imports minipar.parallel.tp.layers, which "
        "minipar.parallel.dp may not: a parallel form never imports a sibling form")
    assert errors[2].startswith("minipar.parallel.pp.schedule imports minipar.parallel.mesh.dims")


def test_what_each_rule_allows_and_forbids():
    allowed = {"minipar.optim.adam": ["minipar.nn.parameter", "minipar.runtime.context"],
               "minipar.parallel.mesh.parallelize": ["minipar.parallel.dp.fsdp",
                                                     "minipar.parallel.tp.gpt", "minipar.nn"],
               "minipar.parallel.checkpoint.dp": ["minipar.files", "minipar.parallel.dp.zero"],
               "minipar.parallel": ["minipar.parallel.dp", "minipar.parallel.mesh"],
               "minipar.cli": ["minipar", "minipar.programs.train", "minipar.course"],
               "minipar.programs.tour.model": ["minipar.nn", "minipar.plan", "minipar"],
               "minipar.runtime.launch": ["minipar.runtime.result"]}
    assert layering_errors(allowed) == []
    forbidden = {"minipar.optim.adam": ["minipar.nn.gpt"],
                 "minipar.runtime.launch": ["minipar.nn.parameter"],
                 "minipar.files": ["minipar.nn"],
                 "minipar.plan.flops": ["minipar.nn.config"],
                 "minipar.viz.timeline": ["minipar.parallel.dp"],
                 "minipar.nn.gpt": ["minipar"],
                 "minipar.course.grading": ["minipar.programs.train"],
                 "minipar.programs.train": ["minipar.cli"],
                 "minipar.parallel.tp.gpt": ["minipar.files"],
                 "minipar.widgets.knob": ["minipar.runtime"]}
    errors = layering_errors(forbidden)
    assert [e.split(" ")[0] for e in errors] == sorted(forbidden)
    assert "the course never imports programs or the command line" in errors[0]
    assert "programs may import all but the command line" in errors[6]
    assert "belongs to no component of RULES" in errors[-1]


def test_plan_and_viz_read_schedules_that_import_nothing_else():
    allowed = {"minipar.plan.pipeline": ["minipar.parallel.pp.schedules",
                                         "minipar.parallel.pp.dry_run", "minipar.runtime"],
               "minipar.viz.timeline": ["minipar.parallel.pp.actions"],
               "minipar.parallel.pp.dry_run": ["minipar.parallel.pp.lowering"],
               "minipar.parallel.pp.runner": ["minipar.parallel.pp.lowering", "minipar.nn"]}
    assert layering_errors(allowed) == []
    forbidden = {"minipar.plan.pipeline": ["minipar.parallel.pp"],   # the package: the runner
                 "minipar.parallel.pp.schedules": ["minipar.runtime.p2p"],
                 "minipar.parallel.pp.validate": ["minipar.parallel.pp.runner"],
                 "minipar.viz.timeline": ["minipar.parallel.pp.runner"]}
    errors = layering_errors(forbidden)
    assert [e.split(" ")[0] for e in errors] == sorted(forbidden)
    assert "a pipeline schedule is plain data: no communication" in errors[0]
    assert "the formulas take plain numbers and schedules" in errors[2]


def test_an_import_cycle_is_reported():
    assert cycle_errors({"minipar.runtime.a": {"minipar.runtime.b": 1},
                         "minipar.runtime.b": {"minipar.runtime.a": 9}}) == [
        "import cycle: minipar.runtime.a -> minipar.runtime.b -> minipar.runtime.a; break it "
        "by moving what both sides need into a module of its own"]
    three = cycle_errors({"a": ["b"], "b": ["c"], "c": ["a", "d"], "d": [], "e": ["e"]})
    assert [e.split(";")[0] for e in three] == ["import cycle: a -> b -> c -> a",
                                               "import cycle: e -> e"]
    assert cycle_errors({"a": ["b", "c"], "b": ["c"], "c": []}) == []


def test_a_function_local_import_is_reported():
    source = ("import numpy as np\n\n"
              "def f():\n"
              "    from minipar.runtime import context\n"
              "    import matplotlib.pyplot as plt\n"
              "    from .backends.mpi import launch_mpi\n"
              "    return importlib.import_module('minipar.nn')\n")
    modules = {"minipar.runtime.context", "minipar.runtime.backends.mpi"}
    found = parse_imports(source, "minipar.runtime.launch", False, modules)
    assert found == [Import("numpy", 1, False), Import("minipar.runtime.context", 4, True),
                     Import("matplotlib.pyplot", 5, True),
                     Import("minipar.runtime.backends.mpi", 6, True),
                     Import("minipar.nn", 7, True, dynamic=True)]
    mpi = parse_imports("from mpi4py import MPI\n", "minipar.runtime.backends.mpi")
    errors = local_import_errors({"minipar.runtime.launch": found,
                                  "minipar.runtime.backends.mpi": mpi})
    assert errors == [  # matplotlib, and the module that needs mpi4py to load, may wait
        "minipar.runtime.launch (line 4) imports minipar.runtime.context inside a function: "
        "move it to the top (only optional dependencies, mpi4py, matplotlib, are imported "
        "where they are used)",
        "minipar.runtime.launch (line 7) imports minipar.nn by name at run time, hidden from "
        "the import rules: import it at the top"]
    assert len(local_import_errors({"m": found}, optional=())) == 4


def test_imports_resolve_as_python_resolves_them():
    modules = {"minipar.files", "minipar.runtime", "minipar.runtime.launch",
               "minipar.parallel.dp", "minipar.parallel.dp.ddp"}
    source = ("from minipar import files, __version__\n"
              "from ..launch import LaunchResult\n"
              "from . import ddp\n"
              "from .dp import *\n")
    got = [i.target for i in parse_imports(source, "minipar.runtime.backends.mpi", False, modules)]
    assert got[:3] == ["minipar.files", "minipar", "minipar.runtime.launch"]
    source = "from . import ddp\nfrom .ddp import DistributedDataParallel\n"
    for module, is_package in (("minipar.parallel.dp", True), ("minipar.parallel.dp.zero", False)):
        got = [i.target for i in parse_imports(source, module, is_package, modules)]
        assert got == ["minipar.parallel.dp.ddp", "minipar.parallel.dp.ddp"]
    got = parse_imports("from .dp import *\n", "minipar.parallel", True, modules)
    assert got == [Import("minipar.parallel.dp", 1, False)]


def test_a_citation_outside_the_repository_is_reported(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("x")
    text = ("Source: the seeds' Case A (../shared/seeds/000), see DESIGN.md.\n"
            "[up](../README.md) [out](../../elsewhere.md) [gone](missing.md) [web](https://x.org)\n"
            "random seeds are fine; so is [this page](#top).\n")
    errors = outside_citation_errors("docs/page.md", text, root=tmp_path)
    seeds = "the seeds are not part of the repository: describe the case itself, or cite a paper"
    assert errors == [
        "docs/page.md:1 cites '../shared': ../shared is outside the repository",
        "docs/page.md:1 cites 'DESIGN.md': DESIGN.md is not part of the repository: state the "
        "rule where it applies",
        f"docs/page.md:1 cites 'the seeds': {seeds}",
        f"docs/page.md:1 cites 'seeds/': {seeds}",
        "docs/page.md:2 links to ../../elsewhere.md, outside the repository",
        "docs/page.md:2 links to missing.md, which does not exist"]
    assert outside_citation_errors("minipar/x.py", "[a](../../b.md)", root=tmp_path) == []


# ---- the real tree is clean --------------------------------------------------------------
def test_the_tree_is_read():
    imports = tree_imports()
    graph = import_graph(imports)
    assert len(graph) > 80 and "minipar.parallel.dp.engine" in graph
    assert "minipar.runtime.context" in graph["minipar.nn.matmul"]
    assert "minipar.runtime.result" in graph["minipar.runtime.backends.mpi"]
    assert [i.target for i in imports["minipar.runtime.launch"] if i.local] == [
        "minipar.runtime.backends.mpi"]  # needs mpi4py to load: imported where it is used


def test_every_import_follows_the_rules():
    errors = layering_errors(import_graph(tree_imports()))
    assert not errors, "\n".join(errors)


def test_no_import_cycles():
    errors = cycle_errors(import_graph(tree_imports()))
    assert not errors, "\n".join(errors)


def test_no_function_local_imports():
    errors = local_import_errors(tree_imports())
    assert not errors, "\n".join(errors)


def test_nothing_cites_a_file_outside_the_repository():
    texts = cited_texts()
    assert "docs/runtime.md" in texts and "minipar/runtime/launch.py" in texts
    errors = [e for path, text in sorted(texts.items()) for e in outside_citation_errors(path, text)]
    assert not errors, "\n".join(errors)


MAX_LINES = 400  # a reader reads a file top to bottom: one idea, a few hundred lines


def long_module_errors(lengths: dict[str, int]) -> list[str]:
    """One message per module longer than MAX_LINES, naming it and its length."""
    return [f"{name} has {n} lines, over {MAX_LINES}: split it along its ideas"
            for name, n in sorted(lengths.items()) if n > MAX_LINES]


def test_a_long_module_is_reported():
    assert long_module_errors({"minipar/a.py": 401, "minipar/b.py": 400}) == [
        "minipar/a.py has 401 lines, over 400: split it along its ideas"]


def test_no_module_is_over_400_lines():
    lengths = {str(p.relative_to(ROOT)): len(p.read_text().splitlines())
               for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}
    assert len(lengths) > 100
    errors = long_module_errors(lengths)
    assert not errors, "\n".join(errors)
