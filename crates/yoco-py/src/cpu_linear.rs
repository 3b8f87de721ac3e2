//! `yoco_rs._core.linear_f32` / `linear_bf16`: binding of `yoco_cpu`'s row-invariant CPU linear layer
//! (`y = x · wᵀ` in MKL's GEMM order for any row count), GIL released. No logic here: the arrays'
//! shapes and strides become `yoco_cpu::Mat`s, which the kernel checks against the buffers.

use numpy::{
    Element, PyArray2, PyArrayMethods, PyReadonlyArray2, PyReadwriteArray2, PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use yoco_cpu::{Layout, LinearError, Mat, MatMut, Weights, PANEL};

fn to_py(e: LinearError) -> PyErr {
    match e {
        LinearError::Shape(s) => PyValueError::new_err(s),
        LinearError::Unavailable => PyRuntimeError::new_err(e.to_string()),
    }
}

/// `(rows, cols, row stride in elements)` of a 2-D array whose rows are contiguous.
fn layout<T: Element>(name: &str, a: &Bound<'_, PyArray2<T>>) -> PyResult<(usize, usize, usize)> {
    let (rows, cols) = (a.shape()[0], a.shape()[1]);
    let size = std::mem::size_of::<T>() as isize;
    let s = a.strides();
    if cols > 1 && s[1] != size {
        return Err(PyValueError::new_err(format!(
            "{name}: the rows must be contiguous (column stride {} bytes)",
            s[1]
        )));
    }
    if rows > 1 && (s[0] < 0 || s[0] % size != 0) {
        return Err(PyValueError::new_err(format!(
            "{name}: row stride {} bytes is not a positive multiple of {size}",
            s[0]
        )));
    }
    let ld = if rows > 1 {
        (s[0] / size) as usize
    } else {
        cols
    };
    Ok((rows, cols, ld))
}

/// `(layout, elements spanned)` of a 2-D `[N, K]` weight array: row-major (`K` contiguous) or K-major
/// (`N` contiguous: the `[N, K]` view of a `[K, N]` array).
fn weight_layout<T: Element>(
    a: &Bound<'_, PyArray2<T>>,
) -> PyResult<(usize, usize, Layout, usize)> {
    let (n, k) = (a.shape()[0], a.shape()[1]);
    let size = std::mem::size_of::<T>() as isize;
    let s = a.strides();
    let elems = |b: isize| (b / size) as usize;
    if s.iter().any(|&b| b < 0 || b % size != 0) {
        return Err(PyValueError::new_err(
            "w: strides must be non-negative multiples of the element size",
        ));
    }
    if k <= 1 || s[1] == size {
        let ld = if n > 1 { elems(s[0]) } else { k };
        Ok((n, k, Layout::RowMajor { ld }, span(n, k, ld)))
    } else if n <= 1 || s[0] == size {
        let ld = elems(s[1]);
        Ok((n, k, Layout::KMajor { ld }, span(k, n, ld)))
    } else {
        Err(PyValueError::new_err(
            "w: neither its rows nor its columns are contiguous",
        ))
    }
}

/// `(layout, elements spanned)` of a weight given as its panels, one per row of a `[ceil(N / PANEL),
/// PANEL * K]` array (`n` and `k` from `y` and `x`).
fn panel_layout<T: Element>(
    a: &Bound<'_, PyArray2<T>>,
    n: usize,
    k: usize,
) -> PyResult<(usize, usize, Layout, usize)> {
    let (rows, cols, stride) = layout("w (panels)", a)?;
    if rows != n.div_ceil(PANEL) || cols != PANEL * k {
        return Err(PyValueError::new_err(format!(
            "w (panels): {rows} x {cols}, expected {} x {} for {n} outputs and {k} inputs",
            n.div_ceil(PANEL),
            PANEL * k
        )));
    }
    Ok((
        n,
        k,
        Layout::Panels { ld: stride },
        span(rows, cols, stride),
    ))
}

fn span(rows: usize, cols: usize, ld: usize) -> usize {
    if rows == 0 || cols == 0 {
        0
    } else {
        (rows - 1) * ld + cols
    }
}

fn call<T: Element + Send + Sync>(
    py: Python<'_>,
    x: PyReadonlyArray2<'_, T>,
    w: PyReadonlyArray2<'_, T>,
    y: PyReadwriteArray2<'_, T>,
    panels: bool,
    f: impl FnOnce(Mat<T>, Weights<T>, MatMut<T>) -> Result<(), LinearError> + Send,
) -> PyResult<()> {
    let (xr, xc, xl) = layout("x", &x)?;
    let (yr, yc, yl) = layout("y", &y)?;
    let (wn, wk, wl, wspan) = if panels {
        panel_layout(&w, yc, xc)?
    } else {
        weight_layout(&w)?
    };
    // SAFETY: each span lies inside its array's memory (rows contiguous, strides checked above); the
    // readonly/readwrite borrows keep other Rust code off them while the GIL is released.
    let (xs, ws, ys) = unsafe {
        (
            std::slice::from_raw_parts(x.data() as *const T, span(xr, xc, xl)),
            std::slice::from_raw_parts(w.data() as *const T, wspan),
            std::slice::from_raw_parts_mut(y.data(), span(yr, yc, yl)),
        )
    };
    py.detach(|| {
        f(
            Mat {
                data: xs,
                rows: xr,
                cols: xc,
                ld: xl,
            },
            Weights {
                data: ws,
                n: wn,
                k: wk,
                layout: wl,
            },
            MatMut {
                data: ys,
                rows: yr,
                cols: yc,
                ld: yl,
            },
        )
    })
    .map_err(to_py)
}

/// `y[M, N] = x[M, K] · w[N, K]ᵀ` in f32, blocks of `kc` terms, on `threads` threads; `w` row-major,
/// K-major (the `[N, K]` view of a `[K, N]` array), or with `panels` its panels of 16 outputs, one per row
/// of a `[ceil(N / 16), 16 K]` array (the executor's CPU layout: one sequential stream per panel).
#[pyfunction]
#[pyo3(signature = (x, w, y, kc, threads, panels = false))]
pub fn linear_f32(
    py: Python<'_>,
    x: PyReadonlyArray2<'_, f32>,
    w: PyReadonlyArray2<'_, f32>,
    y: PyReadwriteArray2<'_, f32>,
    kc: usize,
    threads: usize,
    panels: bool,
) -> PyResult<()> {
    call(py, x, w, y, panels, |x, w, y| {
        yoco_cpu::linear_f32(x, w, y, kc, threads)
    })
}

/// The same for bf16 operands given as their raw bits (`uint16` views).
#[pyfunction]
#[pyo3(signature = (x, w, y, kc, threads, panels = false))]
pub fn linear_bf16(
    py: Python<'_>,
    x: PyReadonlyArray2<'_, u16>,
    w: PyReadonlyArray2<'_, u16>,
    y: PyReadwriteArray2<'_, u16>,
    kc: usize,
    threads: usize,
    panels: bool,
) -> PyResult<()> {
    call(py, x, w, y, panels, |x, w, y| {
        yoco_cpu::linear_bf16(x, w, y, kc, threads)
    })
}

/// Whether this CPU runs the kernel (AVX2 and FMA).
#[pyfunction]
pub fn cpu_linear_available() -> bool {
    yoco_cpu::available()
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(linear_f32, m)?)?;
    m.add_function(wrap_pyfunction!(linear_bf16, m)?)?;
    m.add_function(wrap_pyfunction!(cpu_linear_available, m)?)?;
    Ok(())
}
