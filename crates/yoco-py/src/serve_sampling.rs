//! The sampling side of the Rust serving path's executor seam, as Python sees it: the step's grammar
//! masks ([`PyStepMasks`], waited on with the GIL released), the executor's logprob arrays read into
//! the loop's [`StepOutput`], and `--structured-outputs-config` read into the front end's settings.
//! Glue only: what the arrays mean is `yoco_server::executor`'s.

use numpy::ndarray::Array2;
use numpy::{
    IntoPyArray, PyArray1, PyArray2, PyReadonlyArray1, PyReadonlyArray2, PyUntypedArrayMethods,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use yoco_grammar::CompileLimits;
use yoco_server::{ExecError, GrammarMasks, LogprobTable, StepOutput, StructuredConfig};

/// The token bitmasks of one step's constrained sampling rows, computed on the grammar pool while
/// the forward runs. `take()` waits for them (GIL released) and returns `(rows int64[C], bitmask
/// int32[C, words])`: `rows` are positions into the plan's `sample_rows`.
#[pyclass(module = "yoco_rs._core", name = "StepMasks", frozen)]
pub struct PyStepMasks {
    pub(crate) inner: GrammarMasks,
}

/// `(rows, bitmask)` as numpy arrays.
type MaskArrays<'py> = (Bound<'py, PyArray1<i64>>, Bound<'py, PyArray2<i32>>);

#[pymethods]
impl PyStepMasks {
    fn take<'py>(&self, py: Python<'py>) -> PyResult<MaskArrays<'py>> {
        let inner = &self.inner;
        let m = py.detach(|| inner.take());
        let n = m.rows.len();
        let a = Array2::from_shape_vec((n, m.words), m.bitmask)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok((m.rows.into_pyarray(py), a.into_pyarray(py)))
    }
}

fn bad(what: &str) -> ExecError {
    ExecError(format!("executor.collect(): {what}"))
}

/// A 1-D array's values into `into` (its buffer reused: the loop keeps one `StepOutput`).
fn fill1<T: numpy::Element + Copy>(
    x: &Bound<'_, PyAny>,
    what: &str,
    into: &mut Vec<T>,
) -> Result<(), ExecError> {
    let a: PyReadonlyArray1<'_, T> = x.extract().map_err(|_| {
        bad(&format!(
            "{what} must be a 1-D numpy array of the documented dtype"
        ))
    })?;
    let v = a
        .as_slice()
        .map_err(|_| bad(&format!("{what} must be contiguous")))?;
    into.clear();
    into.extend_from_slice(v);
    Ok(())
}

/// A `[n, k]` array's flat values into `into`; returns k.
fn fill2<T: numpy::Element + Copy>(
    x: &Bound<'_, PyAny>,
    what: &str,
    into: &mut Vec<T>,
) -> Result<usize, ExecError> {
    let a: PyReadonlyArray2<'_, T> = x.extract().map_err(|_| {
        bad(&format!(
            "{what} must be a 2-D numpy array of the documented dtype"
        ))
    })?;
    let v = a
        .as_slice()
        .map_err(|_| bad(&format!("{what} must be C-contiguous")))?;
    into.clear();
    into.extend_from_slice(v);
    Ok(a.shape()[1])
}

/// `(token_logprobs f32[n], token_ranks i32[n], top_ids i32[n, k], top_logprobs f32[n, k])`.
fn read_table(
    t: &Bound<'_, PyAny>,
    at: usize,
    what: &str,
    into: &mut LogprobTable,
) -> Result<(), ExecError> {
    let t = t
        .cast::<PyTuple>()
        .map_err(|_| bad(&format!("{what} must be a tuple")))?;
    let item = |i: usize| {
        t.get_item(at + i)
            .map_err(|_| bad(&format!("{what} has too few arrays")))
    };
    fill1::<f32>(&item(0)?, what, &mut into.token_logprobs)?;
    fill1::<i32>(&item(1)?, what, &mut into.token_ranks)?;
    let k = fill2::<i32>(&item(2)?, what, &mut into.top_ids)?;
    let k2 = fill2::<f32>(&item(3)?, what, &mut into.top_logprobs)?;
    if k != k2 {
        return Err(bad(&format!(
            "{what}: top ids and logprobs differ in width"
        )));
    }
    into.k = k;
    Ok(())
}

/// What `StepExecutor.collect()` returned, into `out`: the sampled ids (int32 array), or
/// `(sampled, sample_logprobs | None, prompt_logprobs | None)` with `sample_logprobs = (rows int32[L],
/// logprob f32[L], rank int32[L], top_ids int32[L, K], top_logprobs f32[L, K])` and `prompt_logprobs`
/// the same without `rows`, one entry per prompt position the step asked to score.
pub(crate) fn read_output(r: &Bound<'_, PyAny>, out: &mut StepOutput) -> Result<(), ExecError> {
    out.clear();
    let Ok(t) = r.cast::<PyTuple>() else {
        return fill1::<i32>(r, "the sampled ids (int32)", &mut out.sampled);
    };
    if t.len() != 3 {
        return Err(bad(
            "a tuple must be (sampled, sample_logprobs, prompt_logprobs)",
        ));
    }
    let get = |i| t.get_item(i).map_err(|_| bad("unreadable tuple"));
    fill1::<i32>(&get(0)?, "the sampled ids (int32)", &mut out.sampled)?;
    let slp = get(1)?;
    if !slp.is_none() {
        let s = slp
            .cast::<PyTuple>()
            .map_err(|_| bad("sample_logprobs must be a tuple"))?;
        let rows = s.get_item(0).map_err(|_| bad("sample_logprobs is empty"))?;
        fill1::<i32>(
            &rows,
            "sample_logprobs rows (int32)",
            &mut out.sample_lp_rows,
        )?;
        read_table(&slp, 1, "sample_logprobs", &mut out.sample_logprobs)?;
    }
    let plp = get(2)?;
    if !plp.is_none() {
        read_table(&plp, 0, "prompt_logprobs", &mut out.prompt_logprobs)?;
    }
    Ok(())
}

/// `--structured-outputs-config` (the engine's `structured_outputs_config`, validated by Python)
/// as the front end's settings; unknown keys are the engine's (backend names and the like).
pub(crate) fn structured_config(
    cfg: Option<&Bound<'_, PyDict>>,
    eos_token_ids: &[u32],
) -> PyResult<StructuredConfig> {
    let mut limits = CompileLimits::default();
    let mut compact = false;
    if let Some(d) = cfg {
        for (k, v) in d.iter() {
            let k: String = k.extract()?;
            if v.is_none() {
                continue;
            }
            match k.as_str() {
                "time_budget_ms" => limits.time_budget_ms = v.extract()?,
                "max_grammar_size" => limits.max_grammar_size = v.extract()?,
                "initial_lexer_fuel" => limits.initial_lexer_fuel = v.extract()?,
                "max_in_flight" => limits.max_in_flight = v.extract()?,
                "cache_size" => limits.cache_size = v.extract()?,
                "disable_any_whitespace" => compact = v.extract()?,
                _ => {}
            }
        }
    }
    Ok(StructuredConfig {
        eos_token_ids: eos_token_ids.to_vec(),
        limits,
        disable_any_whitespace: compact,
    })
}
