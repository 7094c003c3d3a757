"""The package's module graph: one-way imports, and the specification kept out of production code."""
import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import cfbn

PACKAGE = Path(cfbn.__file__).resolve().parent
ROOT = str(PACKAGE.parent)
# `python -m cfbn` compares the kernels with the specification by design.
SCRIPTS = {"cfbn.__main__"}


def _modules():
    names = ["cfbn"]
    for path in sorted(PACKAGE.iterdir()):
        if path.suffix == ".py" and path.stem != "__init__":
            names.append("cfbn." + path.stem)
        elif path.suffix in (".so", ".pyd") or path.name.endswith(".pyx"):
            names.append("cfbn." + path.name.split(".")[0])
    return sorted(set(names))


def _source(name):
    if name == "cfbn":
        return PACKAGE / "__init__.py"
    stem = name.split(".", 1)[1]
    for suffix in (".py", ".pyx"):
        if (PACKAGE / (stem + suffix)).exists():
            return PACKAGE / (stem + suffix)
    return None


def _imports(name):
    """The cfbn modules `name` imports anywhere in its text (at module level
    or inside a function: a deferred import closes a cycle as well)."""
    path = _source(name)
    if path is None or path.suffix != ".py":
        return set()
    tree = ast.parse(path.read_text(), str(path))
    package = "cfbn"
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == package)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                base = node.module or ""
                if base.split(".")[0] != package:
                    continue
            else:
                base = package + ("." + node.module if node.module else "")
            if base == package:
                # `from . import x` names a submodule when there is one, else an
                # attribute of the package itself.
                for a in node.names:
                    sub = package + "." + a.name
                    found.add(sub if sub in _modules() else package)
            else:
                found.add(base)
    found.discard(name)
    return found


def test_graph_has_no_cycle():
    graph = {m: _imports(m) for m in _modules()}
    # The package's __init__ imports its modules to re-export them; a module
    # importing the package back would be a cycle.
    state = {}

    def visit(m, path):
        if state.get(m) == "done":
            return
        if state.get(m) == "open":
            raise AssertionError("import cycle: " + " -> ".join(path[path.index(m):] + [m]))
        state[m] = "open"
        for n in sorted(graph.get(m, ())):
            visit(n, path + [m])
        state[m] = "done"

    for m in graph:
        visit(m, [])


def test_graph_flows_down():
    graph = {m: _imports(m) for m in _modules()}
    assert graph["cfbn._args"] <= {"cfbn._kernels"}
    for m in ("cfbn._gpu", "cfbn._split", "cfbn.distributed", "cfbn.fold", "cfbn.layer"):
        assert "cfbn._args" in graph[m], m
    for m, deps in graph.items():
        if m not in SCRIPTS and m != "cfbn":
            assert "cfbn.reference" not in deps, "%s imports the reference implementation" % m
            assert "cfbn" not in deps, "%s imports the package it belongs to" % m


def _run(code):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("name", [m for m in _modules() if m not in SCRIPTS])
def test_each_module_imports_alone_without_the_reference(name):
    r = _run("import importlib, sys\n"
             "importlib.import_module(%r)\n"
             "print('cfbn.reference' in sys.modules)\n" % name)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == ("True" if name == "cfbn.reference" else "False")


def test_public_reference_is_loaded_on_first_use():
    r = _run("import sys, cfbn\n"
             "before = 'cfbn.reference' in sys.modules\n"
             "from cfbn import reference\n"
             "assert reference is cfbn.reference is sys.modules['cfbn.reference']\n"
             "assert 'reference' in dir(cfbn) and 'reference' in cfbn.__all__\n"
             "print(before, callable(cfbn.reference.fused_batch_norm))\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "True"]
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        cfbn.no_such_name
