"""The house rules of the module map (ARCHITECTURE.md), checked on the source with ``ast``:
every ``import`` statement counts, those inside functions too."""
from __future__ import annotations

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_LINES = 450
DURABILITY = {"description", "counters", "checkpoint", "rowsums", "jumps", "framestack", "lock", "recovery"}
FACADE_AND_ABOVE = {"store", "views", "stats", "export", "export_d4rl", "export_minari", "slm", "demo", "finals", "envspaces", "sb3", "torchrl", "gym", "ray"}
CLI_MAY_IMPORT = {"diskreplay", "diskreplay.views", "diskreplay.stats", "diskreplay.export", "diskreplay.verify",
                  "diskreplay.errors", "diskreplay.backends", "diskreplay.episodereader"}  # backends: the public BACKENDS list


def _sources() -> dict[str, str]:
    """``{module name: file path}`` of the library (``diskreplay.*``) and the CLI (``diskreplay.cli.*``)."""
    found = {}
    for top, package in (("diskreplay", "diskreplay"), ("cli", "diskreplay.cli")):
        for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
            rel = os.path.relpath(dirpath, os.path.join(ROOT, top))
            parts = [] if rel == "." else rel.split(os.sep)
            for name in files:
                if name.endswith(".py"):
                    mod = parts + ([] if name == "__init__.py" else [name[:-3]])
                    found[".".join([package] + mod)] = os.path.join(dirpath, name)
    return found


SOURCES = _sources()


def _is_package(module: str) -> bool:
    return SOURCES[module].endswith("__init__.py")


def imports_of(module: str) -> set[str]:
    """Absolute names imported by ``module``: a ``from X import y`` counts as importing
    ``X.y`` when that is a module of the project, else ``X``."""
    tree = ast.parse(open(SOURCES[module]).read())
    package = module if _is_package(module) else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                names.add(sub if sub in SOURCES else source)
    return names


GRAPH = {module: {n for n in imports_of(module)} for module in SOURCES}


def project_imports(module: str) -> set[str]:
    return {n for n in GRAPH[module] if n in SOURCES}


def short(module: str) -> str:
    return module.removeprefix("diskreplay.")


LIBRARY = [m for m in SOURCES if not m.startswith("diskreplay.cli")]
CLI = [m for m in SOURCES if m.startswith("diskreplay.cli")]


@pytest.mark.parametrize("module", LIBRARY)
def test_the_library_never_imports_click_or_the_cli(module):
    bad = {n for n in GRAPH[module] if n.split(".")[0] == "click" or n.startswith("diskreplay.cli") or n == "cli"}
    assert not bad, f"{module} imports {bad}"


def test_ring_imports_only_numpy_and_errors_nothing():
    assert GRAPH["diskreplay.ring"] - {"__future__"} == {"numpy"}
    assert GRAPH["diskreplay.errors"] - {"__future__"} == set()


@pytest.mark.parametrize("module", [m for m in LIBRARY if m.startswith("diskreplay.backends")])
def test_backends_know_files_not_durability_or_the_store(module):
    below = {short(n).split(".")[0] for n in project_imports(module)}
    assert not below & (DURABILITY | {"store", "writer", "reader", "session", "layout", "convert", "verify"}), \
        f"{module} imports {below}"


@pytest.mark.parametrize("module", [f"diskreplay.{name}" for name in sorted(DURABILITY)])
def test_durability_modules_never_import_backends(module):
    assert not {n for n in project_imports(module) if n.startswith("diskreplay.backends")}


def _reachable(start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for n in project_imports(todo.pop()):
            if n not in seen:
                seen.add(n)
                todo.append(n)
    return seen


def test_no_module_below_the_facade_imports_it():
    below = _reachable("diskreplay.store")
    assert "diskreplay.store" not in below, "a module the facade imports imports the facade"
    for module in below:
        assert short(module).split(".")[0] not in FACADE_AND_ABOVE, f"the facade depends on {module}"


def test_no_import_cycles():
    for module in SOURCES:
        assert module not in _reachable(module), f"{module} is part of an import cycle"


@pytest.mark.parametrize("module", CLI)
def test_the_cli_uses_public_modules_only(module):
    imported = {n for n in project_imports(module) if not n.startswith("diskreplay.cli")}
    assert imported <= CLI_MAY_IMPORT, f"{module} imports {imported - CLI_MAY_IMPORT}"
    tree = ast.parse(open(SOURCES[module]).read())
    private = sorted({node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                      and node.attr.startswith("_") and not node.attr.startswith("__")})
    assert not private, f"{module} reads private attributes {private}"


# Imported where used, so that ``import diskreplay`` never pulls them in.
OPTIONAL = {"h5py", "matplotlib", "torch", "tensordict", "torchrl", "stable_baselines3", "gymnasium", "ray",
            "minari"}


@pytest.mark.parametrize("module", sorted(SOURCES))
def test_imports_inside_functions_are_optional_dependencies_only(module):
    tree = ast.parse(open(SOURCES[module]).read())
    lazy = set()
    for func in ast.walk(tree):
        if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(func):
                if isinstance(node, ast.Import):
                    lazy.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom):
                    lazy.add("." if node.level else node.module.split(".")[0])
    assert lazy <= OPTIONAL, f"{module} imports {sorted(lazy - OPTIONAL)} inside a function"


@pytest.mark.parametrize("module", sorted(SOURCES))
def test_modules_stay_small(module):
    with open(SOURCES[module]) as f:
        lines = sum(1 for _ in f)
    assert lines <= MAX_LINES, f"{SOURCES[module]} has {lines} lines (at most {MAX_LINES})"


def test_the_rules_see_real_imports():
    """The scanner itself: known edges are found, lazy imports included."""
    assert "diskreplay.writer" in project_imports("diskreplay.store")
    assert "diskreplay.ring" in project_imports("diskreplay.session")
    assert "h5py" in GRAPH["diskreplay.backends.hdf5"]  # imported inside a function
    assert "diskreplay.backends" in project_imports("diskreplay.layout")
