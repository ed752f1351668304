"""The package's layers and their one direction of dependency, checked statically.

Order (a module imports only its own group and lower ranks; two groups of one rank never import
each other):

    errors, lsn → types, casts → schema, events → io | wal → supertable | execution → catalog
    → compaction | query → maintenance → store → orchestration | capture | service (with client) → cli

Imports are read with ``ast`` from the source, lazy ones inside functions included, so the check
costs no import. The core never imports Dagster: only ``history_pipeline.orchestration`` does.
"""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import history_pipeline

PACKAGE = Path(history_pipeline.__file__).parent

#: (group, rank) by module prefix, longest prefix first; every module must match one
LAYERS: dict[str, tuple[str, int]] = {
    "history_pipeline.errors": ("base", 0),
    "history_pipeline.lsn": ("base", 0),
    "history_pipeline.types": ("types", 1),
    "history_pipeline.casts": ("types", 1),
    "history_pipeline.schema": ("schema", 2),
    "history_pipeline.events": ("schema", 2),
    "history_pipeline.io": ("io", 3),
    "history_pipeline.wal": ("wal", 3),
    "history_pipeline.supertable": ("supertable", 4),
    "history_pipeline.execution": ("execution", 4),
    "history_pipeline.engine": ("execution", 4),
    "history_pipeline.catalog": ("catalog", 5),
    "history_pipeline.compaction": ("compaction", 6),
    "history_pipeline.query": ("query", 6),
    "history_pipeline.maintenance": ("maintenance", 7),
    "history_pipeline.store": ("store", 8),
    "history_pipeline": ("store", 8),  # the package itself re-exports HistoryStore
    "history_pipeline.orchestration": ("orchestration", 9),
    "history_pipeline.cli": ("cli", 10),  # the entry point: gathers capture's and service's commands
    "history_pipeline.capture": ("capture", 9),
    "history_pipeline.service": ("service", 9),
    "history_pipeline.client": ("service", 9),
    "history_pipeline.sample": ("cli", 10),
}

#: (importer, imported) edges allowed against the order, each with the reason; keep it empty
KNOWN_EXCEPTIONS: dict[tuple[str, str], str] = {}


def layer_of(module: str) -> tuple[str, int] | None:
    """The (group, rank) of a module: its longest matching prefix in LAYERS."""
    for prefix in sorted(LAYERS, key=len, reverse=True):
        if module == prefix or module.startswith(prefix + "."):
            return LAYERS[prefix]
    return None


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports_of(module: str, source: str, is_package: bool = False) -> set[str]:
    """Every module ``source`` imports (top-level and inside functions), relative ones resolved."""
    package = module if is_package else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            # ``from history_pipeline.x import y`` may name a submodule y
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def violations(importer: str, imported: set[str], known: set[str]) -> list[str]:
    """The imports of ``importer`` that go up the order or sideways into another group."""
    group, rank = layer_of(importer) or ("?", -1)
    out = []
    for target in sorted(imported):
        if not target.startswith("history_pipeline") or target not in known:
            continue
        other = layer_of(target)
        if other is None or other[0] == group:
            continue
        if other[1] >= rank and (importer, target) not in KNOWN_EXCEPTIONS:
            out.append(f"{importer} ({group}, {rank}) imports {target} ({other[0]}, {other[1]})")
    return out


def test_every_module_has_a_layer():
    unplaced = [m for m in modules() if layer_of(m) is None]
    assert not unplaced, f"put these modules in LAYERS: {unplaced}"
    assert len(modules()) > 40


def test_imports_follow_the_layer_order():
    found = modules()
    known = set(found)
    problems = []
    for module, path in sorted(found.items()):
        problems += violations(module, imports_of(module, path.read_text(), path.name == "__init__.py"), known)
    assert not problems, "imports against the layer order:\n" + "\n".join(problems)
    assert all(layer_of(a) and layer_of(b) for a, b in KNOWN_EXCEPTIONS)


def test_the_check_sees_lazy_upward_and_sideways_imports():
    """The checker itself: an import inside a function, up the order or into a sibling, is caught."""
    known = {"history_pipeline.query.scan", "history_pipeline.compaction.compactor", "history_pipeline.types",
             "history_pipeline.casts", "history_pipeline.store"}
    lazy_sideways = "def f():\n    from history_pipeline.query.scan import live_view\n"
    assert violations("history_pipeline.compaction.frames",
                      imports_of("history_pipeline.compaction.frames", lazy_sideways), known)
    upward = "from history_pipeline import store\n"
    assert violations("history_pipeline.types", imports_of("history_pipeline.types", upward), known)
    relative_down = "from ..casts import cast_value\n"
    assert imports_of("history_pipeline.compaction.plan", relative_down) >= {"history_pipeline.casts"}
    assert not violations("history_pipeline.compaction.plan",
                          imports_of("history_pipeline.compaction.plan", relative_down), known)


def test_core_never_imports_dagster_even_lazily():
    for module, path in modules().items():
        if layer_of(module) == ("orchestration", 9):
            continue
        names = imports_of(module, path.read_text(), path.name == "__init__.py")
        assert not any(n == "dagster" or n.startswith(("dagster.", "dagster_")) for n in names), module


def test_core_modules_do_not_import_dagster():
    core = [
        m.name
        for m in pkgutil.walk_packages(history_pipeline.__path__, "history_pipeline.")
        if not m.name.startswith("history_pipeline.orchestration")
    ]
    code = "import sys\n" + "".join(f"import {name}\n" for name in core) + "print('dagster' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
    assert len(core) > 15



def test_history_store_is_the_narrow_handle_the_core_takes(tmp_path):
    """Compaction and maintenance take ``DatabaseHandle`` / ``CompactionHandle``, not the whole store."""
    from history_pipeline import HistoryStore, StoreSettings
    from history_pipeline.catalog.handle import CompactionHandle, CompactionSettings, DatabaseHandle

    store = HistoryStore.open(tmp_path / "root", database="db", settings=StoreSettings(spark_master=None))
    assert isinstance(store, CompactionHandle)
    assert isinstance(store.settings, CompactionSettings)

    class NoWal:
        database, objects, catalog = store.database, store.objects, store.catalog

    assert not isinstance(NoWal(), DatabaseHandle)
