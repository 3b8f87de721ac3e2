//! `yoco_rs._core`: the thin PyO3 boundary over `yoco-core`. No engine logic lives here.
use pyo3::prelude::*;
mod text; // yoco-text binding (engine)

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    text::register(m)?; // engine: TextBatch
    Ok(())
}
