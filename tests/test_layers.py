"""The layers of the code base (docs/architecture.md), checked by walking every import.

Each top-level folder installs as one package under the steptail namespace (pyproject.toml,
package-dir) and is one layer; bottom to top:

    parsers < runs < storage < dashboards < collector < simcluster < steptail (CLI, API)

An import may point to its own layer or a lower one, never up. Inside `collector/` the same
holds for its rooms (collector/__init__.py), bottom to top:

    notify < offline < cluster < live < archive
 The simulated cluster is for
the CLI's `demo` and `simcluster` commands only. No two modules may import each other, even
through others or inside functions. `steptail` itself (the namespace root: `__version__` and
a lazy `open`) may be imported from anywhere.

Every import counts: at module level or inside a function, `import x` and `from x import y`
(`from steptail import api` is an import of the module steptail.api)."""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# folder -> its package, bottom layer first
LAYERS = {
    "parsers": "steptail.parsers",
    "runs": "steptail.runs",
    "storage": "steptail.storage",
    "dashboards": "steptail.dashboards",
    "collector": "steptail.collector",
    "simcluster": "steptail.simcluster",
    "steptail": "steptail",
}
RANK = {pkg: i for i, pkg in enumerate(LAYERS.values())}
NAMESPACE_ROOT = "steptail"
SIMULATOR = "steptail.simcluster"
SIMULATOR_USERS = {"steptail.commands.demo", "steptail.commands.simcluster"}
COLLECTOR = "steptail.collector"
ROOMS = ["notify", "offline", "cluster", "live", "archive"]  # collector's rooms, bottom first


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    path: str  # its file, relative to the repository
    line: int
    target: str  # the imported module (or the package a name was taken from)
    text: str  # the import as written


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT)
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    package = LAYERS[parts[0]]
    return ".".join([package, *parts[1:]])


def source_files() -> list[Path]:
    return sorted(p for folder in LAYERS for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


MODULES = {module_name(p): p for p in source_files()}


def layer(module: str) -> str | None:
    """The package (layer) a steptail module belongs to; None for the namespace root and for
    modules outside steptail."""
    if module == NAMESPACE_ROOT:
        return None
    if not module.startswith(NAMESPACE_ROOT + "."):
        return None
    return max((pkg for pkg in LAYERS.values() if module == pkg or module.startswith(pkg + ".")), key=len)


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    base = node.module or ""
    if not node.level:
        return base
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    package = package[: len(package) - (node.level - 1)]
    return ".".join([*package, base] if base else package)


def _segment(lines: list[str], node: ast.stmt) -> str:
    """ast.get_source_segment, without splitting the whole file again for each node (that made
    this walk seconds of every xdist worker's collection)."""
    parts = [line.encode() for line in lines[node.lineno - 1:node.end_lineno]]
    parts[-1] = parts[-1][:node.end_col_offset]
    parts[0] = parts[0][node.col_offset:]
    return "\n".join(part.decode() for part in parts)


@functools.cache
def imports() -> list[Import]:
    """Every import of the project's modules, walked once, when a test first asks."""
    out = []
    for module, path in MODULES.items():
        source = path.read_text()
        lines = source.splitlines()
        rel = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(source, str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(module, path, node)
                # `from pkg import mod` imports the module pkg.mod; `from mod import name` imports mod
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
            else:
                continue
            text = _segment(lines, node)
            for target in dict.fromkeys(targets):
                if layer(target) is not None or target == NAMESPACE_ROOT:
                    out.append(Import(module, rel, node.lineno, target, " ".join(text.split())))
    return out


def _where(i: Import) -> str:
    return f"{i.path}:{i.line}: {i.text}"


def test_the_walk_sees_every_layer():
    found = {layer(m) for m in MODULES}
    assert found >= set(LAYERS.values())
    assert len(imports()) > 100  # the walk found the imports at all


def test_imports_point_down():
    wrong = []
    for i in imports():
        here, there = layer(i.module) or NAMESPACE_ROOT, layer(i.target)  # the root: top layer
        if there is not None and RANK[there] > RANK[here]:
            wrong.append(f"{_where(i)}  ({here} imports {there}, a higher layer)")
    assert not wrong, "imports from a lower layer to a higher one:\n" + "\n".join(wrong)


def room(module: str) -> str | None:
    """The collector room a module is in (None: not in the collector, or its __init__)."""
    parts = module.split(".")
    return parts[2] if module.startswith(COLLECTOR + ".") and len(parts) > 3 else None


def test_every_collector_module_is_in_a_room():
    loose = [str(p.relative_to(ROOT)) for m, p in MODULES.items()
             if layer(m) == COLLECTOR and m != COLLECTOR and room(m) is None and p.name != "__init__.py"]
    assert not loose, f"collector modules outside its rooms {ROOMS}: {loose}"
    assert {room(m) for m in MODULES if room(m)} == set(ROOMS)


def test_collector_rooms_point_down():
    wrong = [f"{_where(i)}  ({room(i.module)} imports {room(i.target)}, a higher room)"
             for i in imports() if room(i.module) and room(i.target)
             and ROOMS.index(room(i.target)) > ROOMS.index(room(i.module))]
    assert not wrong, "imports from a lower collector room to a higher one:\n" + "\n".join(wrong)


def test_only_the_cli_commands_import_the_simulator():
    wrong = [
        _where(i)
        for i in imports()
        if layer(i.target) == SIMULATOR and layer(i.module) != SIMULATOR and i.module not in SIMULATOR_USERS
    ]
    assert not wrong, "production code importing the simulated cluster:\n" + "\n".join(wrong)


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), or a module importing itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in edges.get(v, ()):
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    edges: dict[str, set[str]] = {}
    for i in imports():
        if i.target != NAMESPACE_ROOT and i.module != NAMESPACE_ROOT and i.target in MODULES:
            edges.setdefault(i.module, set()).add(i.target)
    cycles = _cycles(edges)
    lines = []
    for component in cycles:
        members = set(component)
        lines.append(" <-> ".join(component))
        lines += [f"    {_where(i)}" for i in imports() if i.module in members and i.target in members]
    assert not cycles, "modules importing each other:\n" + "\n".join(lines)


@pytest.mark.parametrize("folder", ["parsers", "runs"])
def test_the_core_does_no_network_or_process_io(folder):
    """parsers and runs: no sockets, subprocesses, HTTP or SQL (they are fed lines and batches)."""
    banned = {"subprocess", "socket", "aiohttp", "sqlalchemy", "psycopg", "kubernetes", "asyncio"}
    wrong = []
    for module, path in MODULES.items():
        if layer(module) != LAYERS[folder]:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            wrong += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names if n.split(".")[0] in banned]
    assert not wrong, f"{folder}/ importing I/O libraries:\n" + "\n".join(wrong)


def test_the_checks_see_what_they_look_for():
    assert layer("steptail.storage.sql") == "steptail.storage"
    assert layer("steptail.commands.demo") == "steptail"
    assert layer("steptail") is None and layer("sqlalchemy") is None
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"a"}}) == [["a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
