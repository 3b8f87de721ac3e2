"""The package imports, exposes its version, and the extension and its stub agree both ways: every name
in ``_core.pyi`` exists in ``yoco_rs._core``, and every public name of the extension (and every public
member of its classes) is declared in the stub, so type checkers and readers see the whole API."""

import ast
import pathlib

import yoco_rs
from yoco_rs import _core


def test_core_version_matches_package_version():
    assert yoco_rs.__version__ == _core.__version__
    assert _core.__version__.count(".") == 2


def test_every_stub_name_exists_in_the_extension():
    names, _ = _stub_names()
    assert names, "stub is empty"
    missing = sorted(n for n in names if not hasattr(_core, n))
    assert not missing, f"in _core.pyi but not in the extension: {missing}"


def _stub_names() -> tuple[set[str], dict[str, set[str]]]:
    """Top-level names of ``_core.pyi``, and per class the names its body declares."""
    stub = pathlib.Path(yoco_rs.__file__).with_name("_core.pyi")
    top, members = set(), {}
    for node in ast.parse(stub.read_text()).body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            top.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            top.add(node.target.id)
        if isinstance(node, ast.ClassDef):
            members[node.name] = {m.name for m in node.body if isinstance(m, ast.FunctionDef)} | {
                m.target.id for m in node.body if isinstance(m, ast.AnnAssign) and isinstance(m.target, ast.Name)}
    return top, members


def test_every_public_extension_name_is_in_the_stub():
    top, members = _stub_names()
    public = {n for n in dir(_core) if not n.startswith("_")} | {"__version__"}
    undeclared = sorted(public - top)
    assert not undeclared, f"in the extension but not in _core.pyi: {undeclared}"
    for name in sorted(public):
        obj = getattr(_core, name)
        if not isinstance(obj, type):
            continue
        missing = sorted(m for m in vars(obj) if not m.startswith("_") and m not in members.get(name, set()))
        assert not missing, f"_core.{name} members missing from _core.pyi: {missing}"


def test_executor_imports_without_the_compiled_core(tmp_path):
    """The GPU check runs from a plain checkout (PYTHONPATH=python) where ``_core`` is not built."""
    import shutil
    import subprocess
    import sys

    pkg = pathlib.Path(yoco_rs.__file__).parent
    shutil.copytree(pkg, tmp_path / "yoco_rs", ignore=shutil.ignore_patterns("_core*.so", "__pycache__"))
    code = ("import yoco_rs, yoco_rs.executor.cuda_graphs, yoco_rs.kernels.backend, yoco_rs.executor.executor; "
            "import sys; assert 'yoco_rs._core' not in sys.modules; "
            f"assert yoco_rs.__file__.startswith({str(tmp_path)!r}), yoco_rs.__file__")
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True, env={"PYTHONPATH": str(tmp_path)})


def test_the_core_is_reachable_as_an_attribute_of_a_fresh_import():
    # The README's check: `import yoco_rs; yoco_rs._core.__version__` in a new interpreter (the
    # package imports its names lazily, so `_core` must resolve on first attribute access too).
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", "import yoco_rs; print(yoco_rs._core.__version__)"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == _core.__version__
