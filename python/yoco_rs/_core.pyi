"""Type stubs of the ``yoco_rs._core`` extension module (crates/yoco-py)."""

__version__: str
