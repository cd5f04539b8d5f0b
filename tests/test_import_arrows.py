"""Arrows that run one way: which package may import which, read from the source with `ast`
(every import statement, at module level or inside a function, and import_module calls with a
literal name), so a lazy import cannot hide a cycle that only shows at run time.

    backend -> paralab_core <- worker     neither imports the other (they may run apart)
    jobs                                  imports neither backend nor worker
    paralab_core                          imports no other package of the repository
    bench -> devtools <- tests            the benchmarks never import the tests
    backend/crud/runs -> backend/crud/nodes, never back
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("backend", "worker", "jobs", "bench", "paralab_core", "devtools")


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, root: Path = ROOT) -> set[str]:
    """Every module name `path` imports: for `from a.b import c` both a.b and a.b.c (c may be
    a module), relative imports resolved against the file's package."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _module_name(path, root).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.add(mod)
            found.update(f"{mod}.{a.name}" for a in node.names if a.name != "*")
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name)
                       and node.func.id in ("import_module", "__import__")))):
            found.add(node.args[0].value)
    return found


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    """{module: the modules it imports} for every .py file of PACKAGES under `root`."""
    return {_module_name(p, root): imports_of(p, root)
            for pkg in PACKAGES for p in sorted((root / pkg).rglob("*.py"))}


def _in(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def offending(edges: dict[str, set[str]], src: str, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(f"{mod} imports {imp}" for mod, imps in edges.items() if _in(mod, src)
                  for imp in imps if any(_in(imp, f) for f in forbidden))


EDGES = graph()

# (importer, what it must never import)
RULES = [
    ("backend", ("worker", "tests", "bench", "devtools")),
    ("worker", ("backend", "tests", "bench", "devtools")),
    ("jobs", ("backend", "worker", "paralab_core", "tests", "bench", "devtools")),
    ("paralab_core", ("backend", "worker", "jobs", "tests", "bench", "devtools")),
    ("bench", ("tests",)),
    ("devtools", ("tests", "bench")),
]


def test_the_graph_is_read():
    """Not vacuous: every package was scanned, and edges that exist are seen (lazy ones too)."""
    for pkg in PACKAGES:
        assert any(_in(m, pkg) for m in EDGES), f"no module of {pkg} scanned"
    assert "paralab_core.queue" in EDGES["backend.services.runs"]
    assert "paralab_core.queue" in EDGES["worker.tasks"]
    assert "devtools.launch" in EDGES["bench.gpu_check"]
    assert "backend.crud.nodes" in EDGES["backend.crud.runs"]
    assert "backend.main" in EDGES["backend.cli.service"]  # imported inside a function


def test_each_package_imports_only_what_it_may():
    bad = [line for src, forbidden in RULES for line in offending(EDGES, src, forbidden)]
    assert not bad, "imports against the arrows:\n" + "\n".join(bad)


def test_crud_nodes_and_runs_are_not_mutual():
    """runs -> nodes (a cancel frees a gang's reservations; a host-lost failure keeps its
    error); nodes reads the log-line rules from crud/log_lines.py, never from runs."""
    # the package too: `from backend import crud` imports crud/runs.py
    assert not {"backend.crud.runs", "backend.crud"} & EDGES["backend.crud.nodes"]


def test_the_reader_resolves_relative_and_lazy_imports(tmp_path):
    """The parser itself, on a hand-written package: a relative import inside a function and
    an import_module call are both edges."""
    pkg = tmp_path / "backend" / "crud"
    pkg.mkdir(parents=True)
    src = pkg / "nodes.py"
    src.write_text("def f():\n    from .runs import x\n    from .. import worker_bridge\n"
                   "import importlib\nimportlib.import_module('worker.app')\n")
    found = imports_of(src, tmp_path)
    assert {"backend.crud.runs", "backend.crud.runs.x", "backend.worker_bridge",
            "worker.app", "importlib"} <= found
