"""What type checkers and readers of the installed package see: the py.typed marker (PEP 561) is
installed with the package, and every public class has a docstring."""

import ast
import importlib.metadata
import pathlib

import flashgla

PACKAGE = pathlib.Path(flashgla.__file__).resolve().parent


def test_py_typed_is_installed():
    assert (PACKAGE / "py.typed").is_file(), f"{PACKAGE / 'py.typed'} is missing: type checkers ignore the hints"
    files = [str(f) for f in importlib.metadata.files("flashgla") or []]
    assert "flashgla/py.typed" in files, "py.typed is not in the installed distribution's RECORD"


def test_every_public_class_has_a_docstring():
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_") and not ast.get_docstring(node):
                missing.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}")
    assert not missing, "public classes without a docstring: " + ", ".join(missing)
