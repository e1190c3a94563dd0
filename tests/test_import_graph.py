"""The package's modules import each other without a circle (issue 40): a module never imports, at its top level
or inside a function, a module that imports it back, directly or through others."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def module_names(package="fairseq_pe"):
    """{module name: path} of every module of ``package`` (a package by its ``__init__``)."""
    names = {}
    for path in (ROOT / package).rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def imported_modules(name, path, modules):
    """The modules of ``modules`` that ``name`` imports anywhere in its code (``from pkg import sub`` counts as an
    import of ``pkg.sub`` when that is a module, else of ``pkg``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t in modules and t != name)
    return found


def circles(graph):
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
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
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def package_graph():
    modules = module_names()
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def test_no_import_circle():
    assert circles(package_graph()) == []


def test_a_circle_is_found():
    """The check sees a circle through a function-level import (tables.py importing back what imports it)."""
    graph = package_graph()
    graph["fairseq_pe.analysis.tables"] = graph["fairseq_pe.analysis.tables"] | {"fairseq_pe.analysis.inputs"}
    assert any({"fairseq_pe.analysis.tables", "fairseq_pe.analysis.inputs"} <= set(c) for c in circles(graph))

