//! Rust errors as specific Python exceptions: `ValueError` for bad configuration or requests,
//! `CapacityError` (a `ValueError` subclass, so HTTP layers that map `ValueError` to 400 stay right)
//! when the KV pool could never hold a request. Never a catch-all.

use pyo3::create_exception;
use pyo3::exceptions::PyValueError;
use pyo3::PyErr;
use yoco_core::Error;

create_exception!(
    _core,
    CapacityError,
    PyValueError,
    "The KV pool can never hold what was asked (e.g. prompt + max_tokens longer than the whole pool)."
);

create_exception!(
    _core,
    EngineDied,
    pyo3::exceptions::PyRuntimeError,
    "Every step loop of serve_http stopped after too many failed steps in a row (the message is the last one's error)."
);

pub fn to_py(e: Error) -> PyErr {
    match e {
        Error::Config(_) | Error::Request(_) => PyValueError::new_err(e.to_string()),
        Error::Capacity(_) => CapacityError::new_err(e.to_string()),
    }
}
