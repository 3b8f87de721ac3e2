"""The golden fixtures of ``yoco-ref`` (``crates/yoco-ref/golden/*.npz``, which the Triton kernel tests
trust) agree with an independent numpy recomputation: ``check_golden.py`` recomputes every expected
array (paged attention at each sliding window, cross rows, KV copy then write) from the fixtures'
inputs and asserts they match."""

import importlib.util
import pathlib

GOLDEN = pathlib.Path(__file__).resolve().parents[1] / "crates" / "yoco-ref" / "golden"


def test_golden_fixtures_match_an_independent_numpy_recomputation(capsys):
    script = GOLDEN / "check_golden.py"
    spec = importlib.util.spec_from_file_location("check_golden", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main()  # asserts on any mismatch
    out = capsys.readouterr().out
    assert "write_and_copy: exact" in out and "cross_out_window" in out
