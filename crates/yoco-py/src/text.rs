//! `yoco_rs._core.TextBatch`: binding of `yoco_text::TextBatch` (incremental detokenization and stop
//! strings for all requests of a step in one call, GIL released). No logic here.

use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyList;
use yoco_text::{SeqOptions, StepText, TextBatch, TextError};

fn to_py(e: TextError) -> PyErr {
    match e {
        TextError::Duplicate(_) => PyValueError::new_err(e.to_string()),
        TextError::Tokenizer(_) => PyRuntimeError::new_err(e.to_string()),
    }
}

/// The text state of every live request (see `crates/yoco-text`).
#[pyclass(module = "yoco_rs._core", name = "TextBatch")]
pub struct PyTextBatch {
    inner: TextBatch,
}

type StepArrays<'py> = (
    Bound<'py, PyArray1<u32>>,
    Bound<'py, PyList>,
    Bound<'py, PyArray1<u32>>,
    Bound<'py, PyArray1<u32>>,
);

#[pymethods]
impl PyTextBatch {
    /// Loads `tokenizer.json`.
    #[new]
    fn new(py: Python<'_>, tokenizer_json: String) -> PyResult<Self> {
        let inner = py
            .detach(|| TextBatch::from_file(&tokenizer_json))
            .map_err(to_py)?;
        Ok(Self { inner })
    }

    /// Registers request `req_id` with its prompt ids (the tail is decoding context).
    #[pyo3(signature = (req_id, prompt, *, skip_special_tokens=true, include_stop_str_in_output=false, stop=Vec::new(), stream=false, detokenize=true))]
    #[allow(clippy::too_many_arguments)]
    fn add(
        &mut self,
        req_id: u64,
        prompt: Vec<u32>,
        skip_special_tokens: bool,
        include_stop_str_in_output: bool,
        stop: Vec<String>,
        stream: bool,
        detokenize: bool,
    ) -> PyResult<()> {
        let opts = SeqOptions {
            skip_special_tokens,
            include_stop_str_in_output,
            stop,
            stream,
            detokenize,
        };
        self.inner.add(req_id, &prompt, opts).map_err(to_py)
    }

    /// One step: `req_ids[k]` got `tokens[k]` (-1: none) with core finish code `finish[k]`.
    /// Returns `(delta_idx u32[D], deltas list[str] D, stop_idx u32[M], stop_which u32[M])`.
    fn step<'py>(
        &mut self,
        py: Python<'py>,
        req_ids: PyReadonlyArray1<'py, u64>,
        tokens: PyReadonlyArray1<'py, i32>,
        finish: PyReadonlyArray1<'py, u8>,
    ) -> PyResult<StepArrays<'py>> {
        let (ids, toks, fin) = (req_ids.as_slice()?, tokens.as_slice()?, finish.as_slice()?);
        if toks.len() != ids.len() || fin.len() != ids.len() {
            return Err(PyValueError::new_err(format!(
                "req_ids, tokens and finish must have one length, got {}, {}, {}",
                ids.len(),
                toks.len(),
                fin.len()
            )));
        }
        let inner = &mut self.inner;
        let out: StepText = py
            .detach(|| inner.step(ids, toks, fin).map(|o| o.clone()))
            .map_err(to_py)?;
        let deltas = PyList::new(py, out.deltas)?;
        Ok((
            out.delta_idx.into_pyarray(py),
            deltas,
            out.stop_idx.into_pyarray(py),
            out.stop_which.into_pyarray(py),
        ))
    }

    /// The request's text so far (None if unknown).
    fn text(&self, req_id: u64) -> Option<String> {
        self.inner.text(req_id).map(str::to_owned)
    }

    /// The request's output token ids so far (int32; None if unknown).
    fn token_ids<'py>(&self, py: Python<'py>, req_id: u64) -> Option<Bound<'py, PyArray1<i32>>> {
        self.inner.tokens(req_id).map(|t| {
            t.iter()
                .map(|&x| x as i32)
                .collect::<Vec<i32>>()
                .into_pyarray(py)
        })
    }

    /// Removes the request and returns `(final text, output token ids int32)` (None if unknown).
    fn take<'py>(
        &mut self,
        py: Python<'py>,
        req_id: u64,
    ) -> Option<(String, Bound<'py, PyArray1<i32>>)> {
        self.inner.take(req_id).map(|(text, ids)| {
            (
                text,
                ids.into_iter()
                    .map(|x| x as i32)
                    .collect::<Vec<i32>>()
                    .into_pyarray(py),
            )
        })
    }

    /// Forgets the request; False if unknown.
    fn remove(&mut self, req_id: u64) -> bool {
        self.inner.remove(req_id)
    }

    fn __contains__(&self, req_id: u64) -> bool {
        self.inner.contains(req_id)
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    #[pyo3(signature = (ids, skip_special_tokens=true))]
    fn decode(&self, py: Python<'_>, ids: Vec<u32>, skip_special_tokens: bool) -> PyResult<String> {
        let inner = &self.inner;
        py.detach(|| inner.decode(&ids, skip_special_tokens))
            .map_err(to_py)
    }

    /// Each id decoded alone, special tokens included (logprob entries).
    fn decode_each(&self, py: Python<'_>, ids: Vec<u32>) -> PyResult<Vec<String>> {
        let inner = &self.inner;
        py.detach(|| inner.decode_each(&ids)).map_err(to_py)
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyTextBatch>()
}
