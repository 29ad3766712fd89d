"""The parts stand on each other one way only (actors <- store <- queues <- supervisor <-
the ``warren`` face), with no import circle between modules, no private name imported from
another folder, and faces that load nothing until a name is used. Each rule is checked on
the source of every module, so a new upward import or circle fails here first."""

import ast
import importlib
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("actors", "store", "queues", "supervisor")
FLOOR = {"actors": 0, "store": 1, "queues": 2, "supervisor": 3, "facade": 4}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    if parts[:2] == ["supervisor", "facade"]:
        return ".".join(["warren", *parts[2:]])
    return ".".join(["warren", *parts])


def sources() -> dict[str, Path]:
    found = {}
    for part in PARTS:
        for path in sorted((ROOT / part).rglob("*.py")):
            found[module_name(path)] = path
    return found


SOURCES = sources()


def part_of(module: str) -> str:
    pieces = module.split(".")
    if len(pieces) > 1 and pieces[1] in PARTS:
        return pieces[1]
    return "facade"


def imports_of(module: str, path: Path) -> list[tuple[str, list[str], int]]:
    """(imported module, names, line) for every import of Warren code;
    a name that is itself a module counts as an import of that module."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for block in ast.walk(tree):  # imports for the type checker only never run
        if isinstance(block, ast.If) and ast.unparse(block.test).endswith("TYPE_CHECKING"):
            block.body = []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("warren"):
                continue
            names = [a.name for a in node.names]
            found.append((target, names, node.lineno))
            for name in names:
                if f"{target}.{name}" in SOURCES:
                    found.append((f"{target}.{name}", [], node.lineno))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("warren"):
                    found.append((alias.name, [], node.lineno))
    return found


def test_no_part_imports_a_part_above_it() -> None:
    upward = []
    for module, path in SOURCES.items():
        for target, _, line in imports_of(module, path):
            if FLOOR[part_of(target)] > FLOOR[part_of(module)]:
                upward.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert upward == []


def test_inside_a_part_imports_are_relative_and_across_parts_absolute() -> None:
    wrong = []
    for module, path in SOURCES.items():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if part_of(module) != "facade" and part_of(node.module) == part_of(module):
                    if node.module.startswith("warren."):
                        wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.module}")
            if isinstance(node, ast.ImportFrom) and node.level:
                package = module if path.name == "__init__.py" else module.rpartition(".")[0]
                pieces = package.split(".")[: len(package.split(".")) - node.level + 1]
                if len(pieces) < 2:
                    wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} climbs out of its part")
    assert wrong == []


def test_no_private_name_is_imported_from_another_folder() -> None:
    private = []
    for module, path in SOURCES.items():
        here = path.parent
        for target, names, line in imports_of(module, path):
            target_path = SOURCES.get(target)
            if target_path is None:
                continue
            folder = target_path.parent if target_path.name != "__init__.py" else target_path.parent
            hidden = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if target.rpartition(".")[2].startswith("_") and target_path.name != "__init__.py":
                hidden.append(target)
            if hidden and folder != here:
                private.append(f"{path.relative_to(ROOT)}:{line} {target} {hidden}")
    assert private == []


def test_no_import_circle() -> None:
    """An import inside a function counts too: it is still a dependency both ways."""
    graph: dict[str, set[str]] = {}
    for module, path in SOURCES.items():
        edges = set()
        for target, _, _ in imports_of(module, path):
            if target in SOURCES and target != module:
                edges.add(target)
        graph[module] = edges
    # A package's face re-exports lazily, so importing a package means running its
    # __init__ only; the edge to a package stands for that.
    circles = []
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                circles.append(" -> ".join(trail[trail.index(nxt) :] + [nxt]))
            elif nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert circles == [], "\n".join(circles)


def loaded_by(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(*(m for m in sys.modules if m.startswith('warren')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(done.stdout.split())


@pytest.mark.parametrize(
    ("statement", "allowed"),
    [
        ("import warren", {"warren", "warren.actors", "warren.actors.lazy"}),
        ("import warren.store", {"warren", "warren.actors", "warren.actors.lazy", "warren.store"}),
        (
            "import warren.queues",
            {"warren", "warren.actors", "warren.actors.lazy", "warren.queues"},
        ),
    ],
)
def test_importing_a_face_loads_nothing_behind_it(statement: str, allowed: set[str]) -> None:
    assert loaded_by(statement) == allowed


def test_the_actor_runtime_loads_without_the_broker() -> None:
    loaded = loaded_by("from warren.actors import Node, ProcessActor, ActorRef")
    assert {m for m in loaded if part_of(m) not in ("actors",) and m != "warren"} == set()
    assert "warren.actors.node" in loaded


def test_a_client_loads_neither_the_engine_nor_the_broker() -> None:
    loaded = loaded_by("from warren import connect")
    assert [
        m for m in loaded if m.startswith(("warren.queues.engine", "warren.queues.broker"))
    ] == []
    assert [m for m in loaded if m.startswith(("warren.store.", "warren.supervisor"))] == []


@pytest.mark.parametrize(
    "face", ["warren", "warren.actors", "warren.store", "warren.queues", "warren.supervisor"]
)
def test_a_face_holds_warrens_names_and_no_others(face: str) -> None:
    """``dir()`` and ``import *`` show the exports and the package's own parts; the helpers a
    face was built with are gone."""
    module = importlib.import_module(face)
    names: dict = {}
    exec(f"from {face} import *", names)
    assert set(names) - {"__builtins__"} == set(module.__all__)
    extra = [n for n in dir(module) if n not in module.__all__]
    assert all(isinstance(getattr(module, n), types.ModuleType) for n in extra), extra
    for helper in ("TYPE_CHECKING", "lazy_face"):
        assert not hasattr(module, helper)


def test_every_error_a_part_defines_is_in_warren_errors_and_is_a_warren_error() -> None:
    """``except warren.errors.X`` works for every error Warren raises, whichever part
    defines it, and ``except WarrenError`` catches each of them."""
    import warren.errors
    from warren.errors import WarrenError

    missing = []
    for part in PARTS:
        module = importlib.import_module(f"warren.{part}.errors")
        for name, cls in vars(module).items():
            if not isinstance(cls, type) or not issubclass(cls, Exception):
                continue
            if cls.__module__ != module.__name__ or name.startswith("_"):
                continue
            assert issubclass(cls, WarrenError), name
            if getattr(warren.errors, name, None) is not cls:
                missing.append(name)
    assert missing == []
    assert set(warren.errors.__all__) == {
        name for name in dir(warren.errors) if isinstance(getattr(warren.errors, name), type)
    }
