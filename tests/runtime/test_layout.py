"""The package's imports point one way: tools → create path (lifecycle) →
node model → base; inside the create path, serving → commands → node_state and
spec_edit (not each other) → request; the entry (cli, __main__) may import any of
them; and no module imports itself back through others (imports inside functions
count)."""
import ast

import pytest

from tests.conftest import ROOT, cycles

PACKAGE = ROOT / "hami_runtime"
RANK = {"": 0, "node": 1, "lifecycle": 2, "tools": 3}
ROOM_RANK = {"": 0, "request": 1, "node_state": 2, "spec_edit": 2, "commands": 3, "serving": 4}
ENTRY = {"hami_runtime.cli", "hami_runtime.__main__"}


def module_name(path):
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def part(module):
    """The layer of hami_runtime.X or hami_runtime.<layer>.X."""
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 and pieces[1] in RANK else ""


def room(module):
    """The room of hami_runtime.lifecycle.<room>.X ("" for the package itself)."""
    pieces = module.split(".")
    return pieces[2] if len(pieces) > 2 and pieces[1] == "lifecycle" and pieces[2] in ROOM_RANK else ""


def imports(path):
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            continue
        for target in targets:
            if target.startswith(("hami_runtime.", "hami_hook.")):
                yield target


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if not p.name.startswith("_region_ffi"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_one_way(path):
    name = module_name(path)
    if name in ENTRY:
        return
    mine = RANK[part(name)]
    backwards = [t for t in imports(path) if RANK[part(t)] > mine]
    assert not backwards, f"{name} imports {backwards} from a later layer"


LIFECYCLE = sorted(p for p in (PACKAGE / "lifecycle").rglob("*.py"))


@pytest.mark.parametrize("path", LIFECYCLE, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_rooms_of_the_create_path_point_one_way(path):
    mine = room(module_name(path))
    targets = [t for t in imports(path) if part(t) == "lifecycle" and room(t) != mine]
    backwards = [t for t in targets if ROOM_RANK[room(t)] >= ROOM_RANK[mine]]
    assert not backwards, f"{module_name(path)} imports {backwards} from a room not below its own"


def test_layers_are_the_ones_named():
    assert {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()} == {"lifecycle", "node", "tools"}
    rooms = {p.name for p in (PACKAGE / "lifecycle").iterdir() if (p / "__init__.py").is_file()}
    assert rooms == set(ROOM_RANK) - {""}
    assert not [p.name for p in (PACKAGE / "lifecycle").glob("*.py") if p.name != "__init__.py"]


def test_no_module_imports_itself_back():
    paths = [*MODULES, *sorted((ROOT / "hami_hook").rglob("*.py"))]
    names = {module_name(p) for p in paths}
    graph = {module_name(p): {t if t in names else t.rpartition(".")[0] for t in imports(p)} & names
             - {module_name(p)} for p in paths}
    assert "hami_runtime.lifecycle.node_state.store" in graph["hami_runtime.lifecycle.commands.create"]  # it sees imports
    assert cycles(graph) == []


@pytest.mark.parametrize("graph,expected", [
    ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
    ({"a": {"b"}, "b": {"a"}, "c": {"a"}}, [["a", "b"]]),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}, [["a", "b", "c"]]),
])
def test_cycles_are_found(graph, expected):
    assert cycles(graph) == expected
