"""`jobs/` is one acyclic package that imports no web code (issue 12): checked with `ast` on
every import statement, module level and inside functions alike."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WEB = ("fastapi", "starlette", "celery", "sqlalchemy", "alembic", "backend", "worker",
       "uvicorn", "redis", "kombu")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports() -> dict[str, set[str]]:
    """module -> the modules it imports (`from a import b` counts a.b when b is a module, else
    a)."""
    files = {module_name(p): p for p in (ROOT / "jobs").rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        out: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                subs = {f"{base}.{a.name}" for a in node.names} & set(files)
                out.update(subs)
                if len(subs) < len(node.names):  # names defined in `base` itself
                    out.add(base)
        graph[mod] = out
    return graph


def test_jobs_imports_no_web_code():
    bad = {(m, i) for m, deps in imports().items() for i in deps
           if i.split(".")[0] in WEB}
    assert not bad, sorted(bad)


def test_jobs_has_no_import_cycle():
    graph = imports()
    internal = {m: {d for d in deps if d in graph and d != m} for m, deps in graph.items()}
    # a package importing its own submodules (jobs.models -> jobs.models.gpt) is no cycle
    # unless the submodule imports the package back, which the search below still sees
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(internal[m]):
            if state.get(d) == 1:
                cycle = stack[stack.index(d):] + [d]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(internal):
        if m not in state:
            visit(m)


def test_no_importlib_for_internal_modules():
    hits = [str(p.relative_to(ROOT)) for p in (ROOT / "jobs").rglob("*.py")
            if "importlib" in p.read_text()]
    assert not hits, hits
