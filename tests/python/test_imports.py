"""The package's import structure: the imports between flashgla's modules form no cycle, neither at module level
nor counting the imports made inside functions at call time (the layers: ops <- distributed <- nn <- models <-
parallel), and every module imports in a fresh interpreter, in a fixed order and in the reverse order."""

import ast
import importlib.util
import os
import pathlib
import subprocess
import sys

import flashgla

PACKAGE = pathlib.Path(flashgla.__file__).resolve().parent


def module_name(path):
    parts = ["flashgla", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules():
    """Every Python module of the installed package, sorted by name."""
    return sorted(module_name(path) for path in PACKAGE.rglob("*.py"))


def importable(name):
    """flashgla.models.hf needs transformers (an optional dependency)."""
    return name != "flashgla.models.hf" or importlib.util.find_spec("transformers") is not None


def imports_of(path, name, in_functions):
    """The modules `name` imports at module level (also inside a module-level if/try), and with in_functions
    also those it imports inside functions (run at call time)."""
    is_package = path.name == "__init__.py"
    base = name.split(".") if is_package else name.split(".")[:-1]
    found = set()

    def visit(nodes):
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not in_functions:
                continue
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    target = ".".join(base[:len(base) - node.level + 1] + ([node.module] if node.module else []))
                else:
                    target = node.module
                found.add(target)
                found.update(f"{target}.{alias.name}" for alias in node.names)  # submodules among the names
            visit(ast.iter_child_nodes(node))

    visit(ast.parse(path.read_text()).body)
    return found


def import_graph(in_functions):
    """module -> the flashgla modules (.py files) it makes Python import (see imports_of). Importing a.b.c
    also runs the packages a and a.b unless they are the importer's own packages (already importing)."""
    known = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in known.items():
        ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        edges = set()
        for target in imports_of(path, name, in_functions):
            parts = target.split(".")
            for i in range(1, len(parts) + 1):
                prefix = ".".join(parts[:i])
                if prefix in known and prefix not in ancestors and prefix != name:
                    edges.add(prefix)
        graph[name] = edges
    return graph


def find_cycle(graph):
    """One cycle as a list of modules (first == last), or None."""
    state = {}

    def visit(node, path):
        state[node] = "open"
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt, path)
                if cycle:
                    return cycle
        path.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node, [])
            if cycle:
                return cycle
    return None


def test_imports_have_no_cycle():
    for in_functions in (False, True):
        graph = import_graph(in_functions)
        assert "flashgla.ops.gla" in graph["flashgla.distributed"], graph["flashgla.distributed"]
        cycle = find_cycle(graph)
        where = "counting imports inside functions" if in_functions else "at module level"
        assert cycle is None, f"import cycle {where}: " + " -> ".join(cycle)


def test_the_check_finds_a_cycle():
    """The check itself: a call-time import of the model layers from the ops would be a cycle."""
    graph = import_graph(True)
    graph["flashgla.ops.gla"] = graph["flashgla.ops.gla"] | {"flashgla.nn.gla"}
    assert find_cycle(graph) is not None


def import_in_fresh_interpreter(names):
    code = "import importlib\nfor name in %r:\n    importlib.import_module(name)\n" % (names,)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=os.path.dirname(sys.executable))


def test_every_module_imports_in_a_fixed_order_and_in_reverse():
    names = [name for name in modules() if importable(name)]
    assert len(names) > 20, names
    for order in (names, names[::-1]):
        result = import_in_fresh_interpreter(order)
        assert result.returncode == 0, f"importing {order} in this order failed:\n{result.stderr}"
