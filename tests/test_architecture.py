"""The shape of `governor/` (docs/architecture.md): rooms, not a tangle.

Read from the source's import statements (every one: module level, inside functions and
under TYPE_CHECKING alike, since a lazy import is still a dependency):
- no import circle anywhere in governor/;
- no module imports another module's private (`_name`) name;
- no class is assembled from two or more governor classes of other modules (the mixin
  pattern that spread one `self` over several files; PyYAML's loader, composed of its own
  parts in one module, is how that library is extended);
- each room imports only the rooms below it in docs/architecture.md's table (`MAY_IMPORT`),
  so the rooms form layers and no two rooms need each other;
- the top of governor/ lists rooms (packages), not loose modules;
- the proxy's addons do not import each other and are all assembled in chain.py; the
  control plane's route modules do not import the app.
Each check fails with the offending modules named, so the message says what to fix.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "governor"


@cache
def _modules() -> dict[str, tuple[Path, ast.Module]]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = (path, ast.parse(path.read_text(encoding="utf-8"), str(path)))
    return found


def _imported_from(module: str, path: Path, node: ast.ImportFrom) -> str | None:
    if not node.level:
        return node.module
    base = module.split(".")
    if path.name != "__init__.py":
        base.pop()
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str) -> list[tuple[str, str | None, int]]:
    """(imported module, imported name or None, line) for each governor import of `module`."""
    modules = _modules()
    path, tree = modules[module]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, None, node.lineno) for alias in node.names if alias.name in modules]
        elif isinstance(node, ast.ImportFrom):
            source = _imported_from(module, path, node)
            if not source or source.split(".")[0] != "governor":
                continue
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if submodule in modules:  # `from package import module`
                    found.append((submodule, None, node.lineno))
                elif source in modules:
                    found.append((source, alias.name, node.lineno))
    return found


def _graph() -> dict[str, set[str]]:
    return {module: {target for target, _, _ in _imports(module)} - {module} for module in _modules()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
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
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def test_no_import_circle_in_governor():
    circles = _cycles(_graph())
    assert not circles, "import circles (each line one circle):\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_the_circle_check_finds_a_circle():
    # the check itself can fail: a made-up graph with a three-module circle and a tail
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"]]


# room -> the rooms it may import (docs/architecture.md); every room may import the root
# package `governor` (its version) and itself. Ordered bottom to top.
_BASE = ("common",)
MAY_IMPORT = {
    "common": (),
    "passport": _BASE,
    "policy": _BASE,
    "evidence": _BASE,
    "store": (*_BASE, "policy"),
    "sessions": (*_BASE, "policy", "evidence"),
    "notify": (*_BASE, "evidence"),
    "witness": (*_BASE, "evidence"),
    "adapters": (*_BASE, "passport", "policy"),
    "runtime": (*_BASE, "passport", "policy", "evidence", "store", "sessions", "notify", "adapters"),
    "control": (*_BASE, "passport", "policy", "evidence", "sessions", "runtime"),
    "proxy": (*_BASE, "passport", "policy", "evidence", "store", "sessions", "notify", "adapters", "runtime",
              "control"),
    "demo": (*_BASE, "passport", "policy", "evidence", "store", "sessions", "notify", "adapters", "runtime",
             "control", "proxy"),
    "cli": (*_BASE, "passport", "policy", "evidence", "store", "sessions", "notify", "witness", "adapters", "runtime",
            "control", "proxy", "demo"),
}


def _room(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] != "__main__" else None


def test_each_room_imports_only_the_rooms_below_it():
    crossings = []
    for module in _modules():
        room = _room(module)
        if room is None:
            continue
        assert room in MAY_IMPORT, f"governor/{room}/ is a room docs/architecture.md and MAY_IMPORT do not name"
        for target, _, line in _imports(module):
            other = _room(target)
            if other is not None and other != room and other not in MAY_IMPORT[room]:
                crossings.append(f"{module} line {line} imports {target} ({room} may not import {other})")
    assert not crossings, "imports across the rooms' layers:\n" + "\n".join(crossings)


def test_the_rooms_form_layers():
    # each room may import only rooms listed before it: so the table itself has no circle
    order = list(MAY_IMPORT)
    for room, below in MAY_IMPORT.items():
        assert all(order.index(other) < order.index(room) for other in below), room


def test_no_module_imports_a_private_name_of_another():
    private = [
        f"{module} line {line}: {name} from {target}"
        for module in _modules()
        for target, name, line in _imports(module)
        if name and name.startswith("_") and not name.startswith("__") and target != module
    ]
    assert not private, "private names imported across modules:\n" + "\n".join(private)


def test_no_class_is_assembled_from_governor_mixins():
    defined: dict[str, set[str]] = {}  # class name -> the governor modules that define one so named
    for module, (_, tree) in _modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                defined.setdefault(node.name, set()).add(module)
    mixed = []
    for module, (_, tree) in _modules().items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = [base.id if isinstance(base, ast.Name) else getattr(base, "attr", None) for base in node.bases]
            ours = [base for base in bases
                    if base in defined and module not in defined[base] and not _is_error_or_protocol(base)]
            if len(ours) > 1:
                mixed.append(f"{module}.{node.name}({', '.join(ours)})")
    assert not mixed, "classes assembled from several governor classes:\n" + "\n".join(mixed)


def _is_error_or_protocol(name: str) -> bool:
    return name.endswith(("Error", "Exception", "Protocol", "API"))


def test_the_top_of_governor_lists_rooms():
    loose = sorted(path.name for path in PACKAGE.glob("*.py") if path.name not in ("__init__.py", "__main__.py"))
    assert not loose, f"modules loose at the top of governor/ (put each in the room it belongs to): {loose}"
    rooms = sorted(path.name for path in PACKAGE.iterdir() if (path / "__init__.py").is_file())
    assert sorted(rooms) == sorted(MAY_IMPORT), f"the rooms are not those docs/architecture.md names: {rooms}"


@pytest.mark.parametrize("room", sorted(MAY_IMPORT))
def test_every_room_is_in_the_map(room):
    assert (PACKAGE / room / "__init__.py").is_file(), f"governor/{room}/ is not a package"
    architecture = (PACKAGE.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert f"governor/{room}/" in architecture, f"docs/architecture.md does not describe governor/{room}/"


# the proxy's addons (governor/proxy/chain.py) and the control plane's route modules
# (governor/control/app.py's create_app): each gets its collaborators from its assembler
PROXY_ADDONS = ("binding", "admission", "unknown", "answers", "in_flight", "origin_guard", "realtime_sockets")
CONTROL_ROUTES = ("probes", "runtime_routes", "sessions_api", "personas", "store_ack", "reviewer_console")


def test_no_proxy_addon_imports_another():
    addons = {f"governor.proxy.{name}" for name in PROXY_ADDONS}
    assert addons <= set(_modules()), "an addon module named here is gone: update PROXY_ADDONS and the map"
    crossings = [f"{module} imports {target}" for module in sorted(addons)
                 for target, _, _ in _imports(module) if target in addons and target != module]
    assert not crossings, "addons importing each other (share state through the FlowState):\n" + "\n".join(crossings)


def test_the_chain_lists_every_addon_in_one_place():
    chain = {target for target, _, _ in _imports("governor.proxy.chain")}
    missing = sorted(name for name in PROXY_ADDONS if f"governor.proxy.{name}" not in chain)
    assert not missing, f"addons not assembled in governor/proxy/chain.py: {missing}"


def test_no_control_route_module_imports_the_app():
    routes = [f"governor.control.{name}" for name in CONTROL_ROUTES]
    assert set(routes) <= set(_modules()), "a route module named here is gone: update CONTROL_ROUTES and the map"
    crossings = [f"{module} imports {target}" for module in routes
                 for target, _, _ in _imports(module) if target == "governor.control.app"]
    assert not crossings, "route modules importing the app (they get a ControlContext):\n" + "\n".join(crossings)


def _top_level_names(tree: ast.Module) -> set[str]:
    """The names a module defines itself (classes, functions, assignments), not those it imports."""
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


# modules whose door is narrow: importers take from them only what they define (BadRequest,
# RequestView and RawHeaders come from adapters/request_view.py, describe and status_for from
# adapters/refusals.py)
NARROW_DOORS = ("governor.adapters.base",)


@pytest.mark.parametrize("door", NARROW_DOORS)
def test_a_narrow_door_passes_on_only_what_it_defines(door):
    path, tree = _modules()[door]
    defined = _top_level_names(tree)
    exported = next((ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                     and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)), [])
    assert not set(exported) - defined, f"{door}.__all__ names what it does not define: {set(exported) - defined}"
    importers = [(module, line, name) for module in _modules() for target, name, line in _imports(module)
                 if target == door and name]
    for test_file in sorted((PACKAGE.parent / "tests").glob("*.py")):
        text = test_file.read_text(encoding="utf-8")
        if door not in text:  # parsed only when it may import from the door
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.module == door:
                importers += [(f"tests/{test_file.name}", node.lineno, alias.name) for alias in node.names]
    assert importers, f"nothing imports {door}: the check reads nothing"
    passed_on = [f"{module} line {line}: {name}" for module, line, name in importers if name not in defined]
    assert not passed_on, f"names imported from {door} that it does not define (import them from their home):\n" \
        + "\n".join(passed_on)
