//! Zero-copy numpy views of Rust-owned buffers.

use numpy::ndarray::{ArrayView1, ArrayView2};
use numpy::{Element, PyArray1, PyArray2};
use pyo3::prelude::*;

/// A 1-D view of `data`, kept alive by `owner`.
///
/// # Safety
/// `data` must live in `owner` and must not be reallocated or freed while `owner` lives.
pub unsafe fn view1<'py, T: Element>(data: &[T], owner: &Bound<'py, PyAny>) -> Bound<'py, PyAny> {
    unsafe { PyArray1::borrow_from_array(&ArrayView1::from(data), owner.clone()) }.into_any()
}

/// A 2-D row-major `[rows, cols]` view of `data` (`rows * cols == data.len()`), kept alive by `owner`.
///
/// # Safety
/// As [`view1`].
pub unsafe fn view2<'py, T: Element>(
    data: &[T],
    rows: usize,
    cols: usize,
    owner: &Bound<'py, PyAny>,
) -> Bound<'py, PyAny> {
    let a = ArrayView2::from_shape((rows, cols), data).expect("shape matches the buffer");
    unsafe { PyArray2::borrow_from_array(&a, owner.clone()) }.into_any()
}
