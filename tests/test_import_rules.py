"""The house rules (ARCHITECTURE.md), checked on the source with ``ast``: every ``import``
statement counts, those inside functions too.

``GROUPS`` is the one table: every module of ``diskreplay/`` and ``cli/`` belongs to exactly
one group, and a group imports only the groups it lists (and its own modules). A new module
fails ``test_every_module_is_in_exactly_one_group`` until it is placed. The scripts of
``scripts/`` have no group, but the rules on cycles, lazy imports and length hold for them too."""
from __future__ import annotations

import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# group: (its modules, as prefixes of their names below ``diskreplay.``; the groups it may import).
# A prefix ending in "." is a folder; any other names one module. ``diskreplay`` is the package's
# own ``__init__`` (the public names).
_BELOW_READERS = ("errors", "core", "disk", "native")
GROUPS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "errors": (("errors",), ()),
    "core": (("core.",), ("errors",)),
    "disk": (("disk.",), ("errors", "core")),
    "native": (("native.",), ("errors", "core")),
    "backends": (("backends.",), ("errors", "core", "disk")),
    # the row checksums and the CRC join take their kernels from native/
    "format": (("format.",), ("errors", "core", "disk", "native")),
    "parts": (("parts.",), ("errors", "core", "disk", "native", "backends", "format")),
    "session": (("session.",), ("errors", "core", "disk", "native", "backends", "format", "parts")),
    # below the facade, so that the store can stream and cut episodes through them
    "streams": (("chrono", "episodereader", "smallints"), _BELOW_READERS),
    "store": (("store",), ("errors", "core", "disk", "native", "backends", "format", "parts", "session", "streams")),
    "verify": (("verify",), ("errors", "core", "disk", "native", "backends", "format", "parts")),
    # readers open stores through the facade and read through its public API; never a session or a part
    "readers": (("views", "stats", "export."), _BELOW_READERS + ("format", "backends", "streams", "store")),
    "api": (("diskreplay",), ("errors", "store")),
    # a few functions for tests instead of private names; it reads the facade's session
    "testing": (("testing",), ("errors", "core", "store", "parts")),
    "integrations": (("sb3", "torchrl", "gym", "envspaces", "demo", "slm.", "ray."),
                     ("api", "errors", "core", "store", "readers", "streams", "parts")),
    "cli": (("cli.",), ("api", "readers", "streams", "verify", "errors", "backends")),
}
# Single modules a group may import beyond its groups, each with its reason.
ALSO = {
    "readers": {"diskreplay.parts.priorities.tree"},  # info names the sum tree in use
}
# What the groups above allow that a finer rule narrows: the CLI sees only public modules.
CLI_MAY_IMPORT = {"diskreplay", "diskreplay.views", "diskreplay.stats", "diskreplay.export", "diskreplay.verify",
                  "diskreplay.errors", "diskreplay.backends", "diskreplay.episodereader"}  # backends: BACKENDS
INTEGRATIONS_MAY_IMPORT_FROM_PARTS = {"diskreplay.parts.priorities.args"}  # slm checks priorities as create does

MAX_LINES = 500
# Modules allowed past the cap, each with its reason; a split is a decision, not a reflex.
LONGER: dict[str, str] = {}
# Imported where used, so that ``import diskreplay`` never pulls them in.
OPTIONAL = {"h5py", "matplotlib", "torch", "tensordict", "torchrl", "stable_baselines3", "gymnasium", "ray",
            "minari", "cpprb", "zstandard"}
# Scripts that import the library inside a function, each with its reason.
LAZY_LIBRARY = {
    "scripts.bench_systems": "only diskreplay's systems load it: a baseline's worker process measures itself alone",
}


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
SCRIPTS = {f"scripts.{name[:-3]}": os.path.join(ROOT, "scripts", name)
           for name in sorted(os.listdir(os.path.join(ROOT, "scripts"))) if name.endswith(".py")}


def _is_package(module: str) -> bool:
    return SOURCES.get(module, "").endswith("__init__.py")


def imports_of(module: str, path: str) -> set[str]:
    """Absolute names imported by ``module``: a ``from X import y`` counts as importing
    ``X.y`` when that is a module of the project, else ``X``."""
    tree = ast.parse(open(path).read())
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
    names.discard(module)  # a package importing its own C extensions
    return names


GRAPH = {module: imports_of(module, path) for module, path in SOURCES.items()}
SCRIPT_GRAPH = {module: {f"scripts.{n}" if f"scripts.{n}" in SCRIPTS else n for n in imports_of(module, path)}
                for module, path in SCRIPTS.items()}


def project_imports(module: str) -> set[str]:
    return {n for n in GRAPH[module] if n in SOURCES}


def short(module: str) -> str:
    return "diskreplay" if module == "diskreplay" else module.removeprefix("diskreplay.")


def groups_of(module: str) -> list[str]:
    name = short(module)
    return [group for group, (members, _) in GROUPS.items()
            if any(name == m or (m.endswith(".") and (name + ".").startswith(m)) for m in members)]


LIBRARY = [m for m in SOURCES if not m.startswith("diskreplay.cli")]
CLI = [m for m in SOURCES if m.startswith("diskreplay.cli")]


@pytest.mark.parametrize("module", sorted(SOURCES))
def test_every_module_is_in_exactly_one_group(module):
    found = groups_of(module)
    assert len(found) == 1, f"{module} is in the groups {found}: place it in exactly one row of GROUPS"


@pytest.mark.parametrize("module", sorted(SOURCES))
def test_a_module_imports_only_the_groups_beneath_it(module):
    (group,) = groups_of(module)
    allowed = set(GROUPS[group][1]) | {group}
    bad = {n for n in project_imports(module)
           if groups_of(n)[0] not in allowed and n not in ALSO.get(group, ())}
    assert not bad, f"{module} ({group}) imports {sorted(bad)}; {group} may import {sorted(allowed)}"


@pytest.mark.parametrize("module", [m for m in SOURCES if groups_of(m) == ["integrations"]])
def test_integrations_reach_parts_only_for_named_modules(module):
    bad = {n for n in project_imports(module) if groups_of(n) == ["parts"]} - INTEGRATIONS_MAY_IMPORT_FROM_PARTS
    assert not bad, f"{module} imports {sorted(bad)}: integrations use the public API"


@pytest.mark.parametrize("module", LIBRARY)
def test_the_library_never_imports_click_or_the_cli(module):
    bad = {n for n in GRAPH[module] if n.split(".")[0] == "click" or n.startswith("diskreplay.cli") or n == "cli"}
    assert not bad, f"{module} imports {bad}"


def test_core_and_errors_know_no_files():
    """core/ is the replay semantics alone: beside errors, numpy and the standard library only."""
    for module in (m for m in SOURCES if groups_of(m) == ["core"]):
        assert not {n for n in GRAPH[module] if n.split(".")[0] in OPTIONAL | {"click"}}, module
    assert GRAPH["diskreplay.core.ring"] - {"__future__"} == {"numpy"}
    assert GRAPH["diskreplay.errors"] - {"__future__"} == set()


def _reachable(start: str, graph: dict) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for n in graph[todo.pop()] & graph.keys():
            if n not in seen:
                seen.add(n)
                todo.append(n)
    return seen


@pytest.mark.parametrize("graph", [GRAPH, SCRIPT_GRAPH], ids=["library", "scripts"])
def test_no_import_cycles(graph):
    for module in graph:
        assert module not in _reachable(module, graph), f"{module} is part of an import cycle"


@pytest.mark.parametrize("module", CLI)
def test_the_cli_uses_public_modules_only(module):
    imported = {n for n in project_imports(module) if not n.startswith("diskreplay.cli")}
    assert imported <= CLI_MAY_IMPORT, f"{module} imports {imported - CLI_MAY_IMPORT}"
    tree = ast.parse(open(SOURCES[module]).read())
    private = sorted({node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                      and node.attr.startswith("_") and not node.attr.startswith("__")})
    assert not private, f"{module} reads private attributes {private}"


ALL_FILES = {**SOURCES, **SCRIPTS}


def _rel(path: str) -> str:
    return os.path.relpath(path, ROOT).replace(os.sep, "/")


def _lazy_imports(path: str) -> set[str]:
    """Top-level names imported inside a function of ``path``."""
    lazy = set()
    for func in ast.walk(ast.parse(open(path).read())):
        if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(func):
                if isinstance(node, ast.Import):
                    lazy.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom):
                    lazy.add("." if node.level else node.module.split(".")[0])
    return lazy


@pytest.mark.parametrize("module", sorted(ALL_FILES))
def test_imports_inside_functions_are_optional_dependencies_only(module):
    lazy = _lazy_imports(ALL_FILES[module])
    allowed = OPTIONAL | ({"diskreplay"} if module in LAZY_LIBRARY else set())
    assert lazy <= allowed, f"{module} imports {sorted(lazy - allowed)} inside a function"


def test_the_scripts_that_import_the_library_lazily_still_do():
    for module in LAZY_LIBRARY:
        assert "diskreplay" in _lazy_imports(ALL_FILES[module]), f"{module} imports diskreplay at the top now: drop it"


@pytest.mark.parametrize("module", sorted(ALL_FILES))
def test_modules_stay_small(module):
    rel = _rel(ALL_FILES[module])
    with open(ALL_FILES[module]) as f:
        lines = sum(1 for _ in f)
    assert lines <= MAX_LINES or rel in LONGER, f"{rel} has {lines} lines (at most {MAX_LINES}, or a reason in LONGER)"


def test_the_exceptions_to_the_cap_are_still_needed():
    for rel in LONGER:
        with open(os.path.join(ROOT, rel)) as f:
            assert sum(1 for _ in f) > MAX_LINES, f"{rel} fits the cap now: drop it from LONGER"


def _documented() -> dict[str, str]:
    """``{path under diskreplay/ or cli/: row text}`` of ARCHITECTURE.md's module tables."""
    rows = {}
    with open(os.path.join(ROOT, "ARCHITECTURE.md")) as f:
        for line in f:
            m = re.match(r"\| `([^`]+\.py)` \|(.*)\|\s*$", line)
            if m:
                assert m.group(1) not in rows, f"ARCHITECTURE.md has two rows for {m.group(1)}"
                rows[m.group(1)] = m.group(2).strip()
    return rows


def _needs_a_row(path: str) -> bool:
    """Every module, but a folder's ``__init__.py`` that holds only its docstring."""
    if not path.endswith("__init__.py"):
        return True
    body = ast.parse(open(path).read()).body
    return not (len(body) == 1 and isinstance(body[0], ast.Expr))


def test_every_module_has_a_row_in_architecture_and_every_row_a_module():
    rows = _documented()
    modules = {}
    for path in SOURCES.values():
        rel = _rel(path)
        if _needs_a_row(path):
            modules[rel.removeprefix("diskreplay/")] = rel
    missing = sorted(set(modules) - set(rows))
    stale = sorted(set(rows) - set(modules))
    assert not missing, f"modules with no row in ARCHITECTURE.md: {missing}"
    assert not stale, f"rows of ARCHITECTURE.md naming no module: {stale}"
    long_rows = sorted(name for name, text in rows.items() if len(text) > 200)
    assert not long_rows, f"rows over 200 characters (say more in the module's docstring): {long_rows}"


def test_the_rules_see_real_imports():
    """The scanner itself: known edges are found, lazy imports included, every group used."""
    assert "diskreplay.session.writer" in project_imports("diskreplay.store")
    assert "diskreplay.core.ring" in project_imports("diskreplay.session.base")
    assert "h5py" in GRAPH["diskreplay.backends.hdf5"]  # imported inside a function
    assert "diskreplay.backends" in project_imports("diskreplay.session.files")
    assert "scripts.bench_fio" in SCRIPT_GRAPH["scripts.bench"]
    assert "scripts.bench_measure" in SCRIPT_GRAPH["scripts.bench_scaling"]
    used = {groups_of(m)[0] for m in SOURCES if len(groups_of(m)) == 1}
    assert used == set(GROUPS), f"groups with no module: {sorted(set(GROUPS) - used)}"


# ---------------------------------------------------------------- rules beyond imports
PART_NAMES = re.compile(r"\b(W_JUMPS|W_STACKS|JUMPS_FILE|JUMP_STATES_FILE|STACK_[A-Z_]+|PRIORITY_FILE)\b")
# Modules outside parts/ and format/ that still name a part's word or file, each with the
# hook that will take it (HOUSE.md 4.3); a module leaves the list when its hook moves. Empty:
# the sessions, convert and verify ask the parts (OpenPart's hooks, Part.check).
NAMES_A_PART: dict[str, str] = {}


def _may_name_parts(module: str) -> bool:
    return groups_of(module)[0] in ("parts", "format")


@pytest.mark.parametrize("module", sorted(SOURCES))
def test_only_parts_name_a_parts_file_or_counter_word(module):
    found = sorted(set(PART_NAMES.findall(open(SOURCES[module]).read())))
    if _may_name_parts(module) or module in NAMES_A_PART:
        return
    assert not found, f"{module} names {found}: ask the part (diskreplay.parts) instead"


def test_the_modules_that_still_name_parts_do():
    for module in NAMES_A_PART:
        assert PART_NAMES.search(open(SOURCES[module]).read()), f"{module} no longer names a part: drop it"


def _project_classes() -> dict[str, set[str]]:
    """``{class name: names of its bases}`` of every class of the library and the CLI."""
    classes = {}
    for path in SOURCES.values():
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, set()).update(
                    b.id if isinstance(b, ast.Name) else b.attr for b in node.bases
                    if isinstance(b, (ast.Name, ast.Attribute)))
    return classes


# Classes with more than one project base, each with its reason; mixins for size are not one.
SEVERAL_BASES = {
    "DiskPrioritizedReplayV4": "SLM-Lab's interface (v4) crossed with the memory kind (prioritized): two axes",
    "DiskPrioritizedReplayV5": "SLM-Lab's interface (v5) crossed with the memory kind (prioritized): two axes",
}


def test_no_class_inherits_from_more_than_one_project_class():
    classes = _project_classes()
    several = {name for name, bases in classes.items() if len(bases & classes.keys()) > 1}
    assert several <= SEVERAL_BASES.keys(), f"classes with several project bases: {sorted(several - SEVERAL_BASES.keys())}"
    assert SEVERAL_BASES.keys() <= several, f"no longer several bases, drop: {sorted(SEVERAL_BASES.keys() - several)}"
