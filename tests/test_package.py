"""The package imports, exposes its version, and every name in the stub exists in the module."""

import ast
import pathlib

import yoco_rs
from yoco_rs import _core


def test_core_version_matches_package_version():
    assert yoco_rs.__version__ == _core.__version__
    assert _core.__version__.count(".") == 2


def test_every_stub_name_exists_in_the_extension():
    stub = pathlib.Path(yoco_rs.__file__).with_name("_core.pyi")
    tree = ast.parse(stub.read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    assert names, "stub is empty"
    missing = sorted(n for n in names if not hasattr(_core, n))
    assert not missing, f"in _core.pyi but not in the extension: {missing}"


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
