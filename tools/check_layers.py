#!/usr/bin/env python3
"""Fails when a C++ include or a Python import runs up the layers.

The layers are README's "Layout of the code". For cc/, each folder may include its own
headers and those of the folders listed before it; folders on one line (eager, graph) may
not include each other. For tf_dtensor/, each module may import its own layer and those
below it, and imports of one layer may not form a circle. Every import counts, including
those inside functions (a deferred import is still an arrow).

Usage: python tools/check_layers.py [ROOT]   (exit status 1 and one line per arrow that runs
up, or per circle; the test suite runs it: tests/test_layers.py).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

# cc/: bottom first. One entry a layer; a tuple is one layer of folders that are siblings.
CC_LAYERS = [
    ("core",),         # Mesh, Layout, shard geometry, Status: absl only, no TF
    ("tf",),           # TF C-API glue: attributes, handles, op names
    ("spmd",),         # Builder, collective groups and lowerings, relayout planner
    ("rules",),        # registry, dispatch, factor engine, <family>_rules.cc, merge helpers
    ("propagation",),  # the request solver
    ("eager", "graph"),  # eager executor; tf.function expansion
    ("device",),       # the TFE_CustomDevice shim and op routing
    ("python",),       # bindings.cc
]

# tf_dtensor/: bottom first. A module's layer is its name without the package (a
# subpackage counts as one module).
PY_LAYERS = [
    ("_errors", "_args", "_core", "_placement_types"),   # values and the C++ module
    ("mesh", "layout", "_tpu", "_block_picture",
     "_cluster", "_ledger", "_clients"),               # Mesh, Layout; clients; ledger
    ("_device", "_tensors"),                           # the device, per context; its values
    ("api", "_packing", "config"),                     # ops on DTensors; meshes, clients
    ("variable", "checkpoint", "_dataset_iterator", "_dataset", "debug", "_tape",
     "_tf_layout_args", "_check", "_estimate"),        # built on api
    ("_save_restore", "_placement_api", "_module", "keras"),  # higher-level APIs
    ("dtensor", "placements", "__init__",
     "launch"),                                        # facades; the launcher (a command)
]

_INCLUDE = re.compile(r'^\s*#\s*include\s+"cc/([^/"]+)/', re.M)


def _rank(layers):
    return {name: i for i, layer in enumerate(layers) for name in layer}


def check_cc(root: Path) -> list[str]:
    rank = _rank(CC_LAYERS)
    problems = []
    for path in sorted((root / "cc").rglob("*")):
        if path.suffix not in (".h", ".cc"):
            continue
        folder = path.relative_to(root / "cc").parts[0]
        if folder not in rank:
            problems.append(f"{path.relative_to(root)}: folder cc/{folder}/ is in no layer "
                            "(add it to CC_LAYERS and to README's table)")
            continue
        for match in _INCLUDE.finditer(path.read_text()):
            target = match.group(1)
            line = path.read_text().count("\n", 0, match.start()) + 1
            if target == folder:
                continue
            if target not in rank:
                problems.append(f"{path.relative_to(root)}:{line}: includes cc/{target}/, in no layer")
            elif rank[target] >= rank[folder]:
                kind = "a sibling" if rank[target] == rank[folder] else "a higher layer"
                problems.append(f"{path.relative_to(root)}:{line}: cc/{folder}/ includes cc/{target}/, "
                                f"{kind}")
    return problems


def _module_of(name: str) -> str | None:
    parts = name.split(".")
    if parts[0] != "tf_dtensor":
        return None
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every import of a tf_dtensor module, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                module = _module_of(alias.name)
                if module:
                    found.append((node.lineno, module))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            module = _module_of(node.module)
            if module == "__init__":  # from tf_dtensor import a, b: each name is a module
                found.extend((node.lineno, alias.name) for alias in node.names)
            elif module:
                found.append((node.lineno, module))
    return found


def check_python(root: Path) -> list[str]:
    rank = _rank(PY_LAYERS)
    package = root / "tf_dtensor"
    problems = []
    edges: dict[str, set[str]] = {}
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package)
        module = relative.parts[0] if len(relative.parts) > 1 else relative.stem
        if module not in rank:
            problems.append(f"{path.relative_to(root)}: module {module} is in no layer "
                            "(add it to PY_LAYERS and to README's table)")
            continue
        for line, target in _imports(path):
            if target == module:
                continue
            if target not in rank:
                continue  # a name imported from the package, not a module
            if rank[target] > rank[module]:
                problems.append(f"{path.relative_to(root)}:{line}: {module} imports {target}, "
                                "a higher layer")
            elif rank[target] == rank[module]:
                edges.setdefault(module, set()).add(target)
    # Circles among modules of one layer.
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                circle = trail[trail.index(nxt):] + [nxt] if nxt in trail else [node, nxt]
                problems.append("tf_dtensor: import circle " + " -> ".join(circle))
            elif nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    return problems


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[1]
    problems = check_cc(root) + check_python(root)
    for problem in problems:
        print(problem)
    if problems:
        print(f"{len(problems)} arrow(s) run up the layers (README, 'Layout of the code').")
        return 1
    print("layers: every C++ include and Python import runs downward")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
