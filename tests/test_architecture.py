"""ARCHITECTURE.md stays true: every file it names exists, the folders import in the direction it draws, the
import graph has no cycle (`if TYPE_CHECKING:` imports included), and no file outside tests/ grows past 500
lines."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("env", "llm_backends", "trainer", "families", "nodes", "graph", "evals")
# what each folder may import (ARCHITECTURE.md, "Dependency direction"); nodes -> graph.settings is for typing only,
# and nodes never import env/ (a task reaches the nodes through its family)
ALLOWED = {
    "env": set(),
    "llm_backends": {"env"},
    "trainer": {"env", "llm_backends"},
    "families": {"env", "llm_backends", "trainer"},
    "nodes": {"llm_backends", "trainer", "families"},
    "graph": {"env", "llm_backends", "trainer", "families", "nodes"},
    "evals": {"env", "llm_backends", "trainer", "families", "nodes", "graph"},
}


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            parts = p.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _imports(path: Path, module: str, top_level_only: bool, typing_too: bool = False) -> set[str]:
    """Project modules `path` imports; imports under `if TYPE_CHECKING:` only with `typing_too` (they never run,
    but a reader and a type checker still follow them)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()

    def visit(node, depth: int) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test) and not typing_too:
                continue
            nested = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda)
            if isinstance(child, ast.Import) and not (top_level_only and depth):
                found.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom) and not (top_level_only and depth):
                base = child.module or ""
                if child.level:  # relative: from .x import y
                    pkg = module.split(".")[: -child.level] if not path.name == "__init__.py" else module.split(".")
                    base = ".".join([*pkg, *([base] if base else [])])
                found.add(base)
                found.update(f"{base}.{a.name}" for a in child.names)
            visit(child, depth + (1 if nested else 0))

    visit(tree, 0)
    return found


def test_every_file_named_in_architecture_md_exists():
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`((?:env|llm_backends|trainer|families|nodes|graph|evals|tests|prompts|docs)/[\w./-]*)`", text))
    named |= set(re.findall(r"`((?:env|llm_backends|trainer|families|nodes|graph|evals|tests|prompts|docs)/[\w/-]+\.\w+)", text))
    assert len(named) >= 25, sorted(named)
    missing = sorted(n for n in named if not (ROOT / n).exists())
    assert not missing, f"ARCHITECTURE.md names files that do not exist: {missing}"


def test_folders_import_in_the_documented_direction():
    mods = _modules()
    wrong = []
    for name, path in mods.items():
        pkg = name.split(".")[0]
        for imp in _imports(path, name, top_level_only=False):
            other = imp.split(".")[0]
            if other in PACKAGES and other != pkg and other not in ALLOWED[pkg]:
                wrong.append(f"{name} imports {imp}")
    assert not wrong, "imports against ARCHITECTURE.md's direction:\n" + "\n".join(sorted(wrong))


def test_import_graph_has_no_cycle():
    """Imports inside functions count too (they run), and so do `if TYPE_CHECKING:` imports."""
    mods = _modules()
    edges = {
        name: {m for m in _imports(path, name, top_level_only=False, typing_too=True) if m in mods and m != name}
        for name, path in mods.items()
    }
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(u: str) -> list[str] | None:
        state[u] = 1
        stack.append(u)
        for v in sorted(edges[u]):
            if state.get(v) == 1:
                return stack[stack.index(v):] + [v]
            if v not in state and (cycle := dfs(v)):
                return cycle
        stack.pop()
        state[u] = 2
        return None

    for m in sorted(mods):
        if m not in state and (cycle := dfs(m)):
            raise AssertionError("import cycle: " + " -> ".join(cycle))


def test_no_source_file_outside_tests_is_over_500_lines():
    long = {str(p.relative_to(ROOT)): n for p in _modules().values()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 500}
    assert not long, f"files over 500 lines: {long}"


def test_nodes_hold_the_graph_nodes_and_two_helpers_and_import_no_env():
    """nodes/ is one module per graph node (final_evaluate sits with evaluate) and at most 2 helpers only nodes use;
    a task reaches the nodes only through its family (families/), never through env/."""
    modules = sorted(p.stem for p in (ROOT / "nodes").glob("*.py") if p.name != "__init__.py")
    nodes = {"apply", "train_stage", "evaluate", "summarize_failures", "propose_config", "validate_config", "report"}
    assert nodes <= set(modules) and len(modules) <= 9, modules
    env = sorted(f"nodes.{m} imports {imp}" for m in modules
                 for imp in _imports(ROOT / "nodes" / f"{m}.py", f"nodes.{m}", top_level_only=False, typing_too=True)
                 if imp.split(".")[0] == "env")
    assert not env, env


# keys that name a family or its answer format: a dict literal keyed by them whose values are functions or classes
# is a string-keyed table of per-family code, which a family's own members replace
FAMILY_KEYS = {"sizes", "levels", "mapf", "rg"}


def test_no_string_keyed_table_of_per_family_functions():
    found = []
    for name, path in _modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        # what a value can name that is code: a function or class of the module, or an imported name
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
        defined |= {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Dict) or not node.keys:
                continue
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
            code = all(isinstance(v, ast.Lambda) or (isinstance(v, ast.Name) and v.id in defined)
                       for v in node.values)
            if keys & FAMILY_KEYS and code:
                found.append(f"{name}:{node.lineno} {sorted(keys)}")
    assert not found, f"string-keyed tables of per-family code (make them members of the family): {found}"


def test_the_mapf_literal_is_written_only_by_its_family_and_the_registry_of_built_in_tasks():
    """MAPF-FrozenLake is one family among others: outside env/ (its testbed), only its family module and the
    registries of built-in tasks name it."""
    allowed = {"families/mapf.py", "families/__init__.py", "trainer/task.py"}
    found = []
    for pkg in ("llm_backends", "trainer", "families", "nodes", "graph", "evals"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and node.value == "mapf" and rel not in allowed:
                    found.append(f"{rel}:{node.lineno}")
    assert not found, f"the task name 'mapf' written outside its family and the registry: {found}"


def test_the_parallel_groups_take_effect(request):
    """Under `--dist loadgroup`, pytest-xdist runs a group's tests on one worker only if it could suffix the test's
    id with its group (tests/conftest.py): a pytest it does not follow (9.2 with pytest-xdist 3.8) ignores the groups
    silently, and the session's vLLM server and every module fixture are then built on both workers."""
    if not os.environ.get("PYTEST_XDIST_WORKER") or not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not a parallel `--dist loadgroup` run")
    assert request.node.nodeid.endswith("@test_architecture.py"), request.node.nodeid
