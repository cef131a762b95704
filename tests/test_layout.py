"""The package is a one-way pipeline: no module imports from a later stage.

Every import in ``ckpt_cli`` is read with ``ast`` (function-level and ``TYPE_CHECKING``
imports too) and its target's stage compared with the importer's. Modules of one stage
may import each other.
"""

from __future__ import annotations

import ast
from pathlib import Path

import ckpt_cli

PACKAGE = Path(ckpt_cli.__file__).parent

# In pipeline order; each entry names the top-level modules or packages of one stage.
STAGES: tuple[tuple[str, ...], ...] = (
    # vocabulary every stage shares; ort: ONNX Runtime's facts (the ops it registers, their
    # shapes and scratch, the functions it expands, what its session refuses, its settings)
    # background: work beside a command (a forked child), for whichever stage asks
    ("errors", "units", "version", "progress", "background", "fast", "native", "native_orders", "graph", "ops", "markers", "ort", "io"),
    # serialize: the file bytes, read and written; session: the settings a written model records, read back
    ("io.load", "io.external", "io.serialize", "io.session"),
    ("analysis",),
    ("planning", "options"),  # options: what a command is asked, as values (a plan's policy among them)
    ("rewrite",),
    ("io.save", "io.safewrite", "io.written", "io.datafile", "optimize"),  # optimize: saves, has ORT optimize, loads back
    ("verify",),
    ("export",),  # a PyTorch module -> a training graph: saves it, runs it on ORT
    ("report",),
    ("api", "session"),  # session: the public SessionOptions of a written model
    ("cli", "__init__"),
)
STAGE_OF = {name: k for k, names in enumerate(STAGES) for name in names}


def _top(module: str) -> str:
    """The stage entry a module belongs to: ``ckpt_cli.analysis.memory`` -> ``analysis``,
    ``ckpt_cli.io.load`` -> ``io.load`` (folders that hold more than one stage are listed
    module by module); the package itself -> ``__init__``."""
    parts = module.split(".")[1:]
    for k in range(len(parts), 0, -1):
        if ".".join(parts[:k]) in STAGE_OF:
            return ".".join(parts[:k])
    return parts[0] if parts else "__init__"


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _targets(path: Path) -> list[tuple[str, int]]:
    """(imported ckpt_cli module, line) for every import in the file."""
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "ckpt_cli"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] != "ckpt_cli":
                continue
            if module == "ckpt_cli":  # `from . import api`: the names are modules
                out += [(f"ckpt_cli.{a.name}" if a.name in STAGE_OF else module, node.lineno) for a in node.names]
            else:
                out.append((module, node.lineno))
    return out


def _edges() -> list[tuple[str, str, str]]:
    """(importer's stage name, imported stage name, where) for every import."""
    edges = []
    for path in sorted(PACKAGE.rglob("*.py")):
        importer = _top(_module_name(path))
        for module, line in _targets(path):
            edges.append((importer, _top(module), f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}"))
    return edges


def test_every_module_has_a_stage():
    tops = {_top(_module_name(p)) for p in PACKAGE.rglob("*.py")}
    assert tops - set(STAGE_OF) == set(), "place new modules in STAGES"


def test_no_module_imports_from_a_later_stage():
    edges = _edges()
    # The reader sees relative, absolute and function-level imports (else this test could not fail).
    pairs = {(a, b) for a, b, _ in edges}
    assert {("api", "rewrite"), ("report", "analysis"), ("analysis", "ops"), ("cli", "api")} <= pairs
    backward = [where for a, b, where in edges if STAGE_OF[b] > STAGE_OF[a]]
    assert backward == []
