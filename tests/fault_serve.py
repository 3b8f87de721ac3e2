"""``yoco-serve`` whose PyTorch executor fails on demand: the fault switch of the black-box tests of the
Rust front end's real executor path (``tests/test_serve_rust_faults.py``). Nothing in the server knows.

``python tests/fault_serve.py SWITCH [yoco-serve flags]`` runs the ``yoco-serve`` CLI after wrapping
``StepExecutor.launch``: while the file SWITCH holds ``always``, every step's launch raises
``DeviceLost``; when it holds ``once``, the next one does and the file is emptied."""

from __future__ import annotations

import sys


class DeviceLost(RuntimeError):
    pass


def _install(switch: str) -> None:
    from yoco_rs.serve import rust_frontend

    real = rust_frontend.StepExecutor.launch

    def launch(self, *a, **k):
        try:
            with open(switch) as f:
                mode = f.read().strip()
        except OSError:
            mode = ""
        if mode == "once":
            open(switch, "w").close()
        if mode in ("once", "always"):
            raise DeviceLost("device lost (injected)")
        return real(self, *a, **k)

    rust_frontend.StepExecutor.launch = launch


if __name__ == "__main__":
    _install(sys.argv[1])
    from yoco_rs.serve.cli import main

    sys.argv = ["yoco-serve", *sys.argv[2:]]
    sys.exit(main())
