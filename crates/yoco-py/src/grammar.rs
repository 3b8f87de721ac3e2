//! `yoco_rs._core.GrammarCompiler` / `CompiledGrammar` / `MatcherTable`: bindings of `yoco-grammar`
//! (structured outputs). No logic here: compilation and mask computation run with the GIL released,
//! and a step's bitmask moves into numpy without a copy.

use std::sync::Arc;

use numpy::ndarray::Array2;
use numpy::{
    IntoPyArray, PyArray1, PyArray2, PyReadonlyArray1, PyReadonlyArray2, PyReadwriteArray2,
};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use yoco_grammar::{CompileLimits, GrammarError, GrammarKind, GrammarSpec, MaskJob, StepMasks};

pyo3::create_exception!(
    _core,
    GrammarBusyError,
    PyRuntimeError,
    "Too many grammars are compiling at once: the request may be retried later (a server answers 503)."
);

fn to_py(e: GrammarError) -> PyErr {
    match e {
        GrammarError::Busy { .. } => GrammarBusyError::new_err(e.to_string()),
        GrammarError::Tokenizer(_) => PyRuntimeError::new_err(e.to_string()),
        _ => PyValueError::new_err(e.to_string()),
    }
}

/// Compiles constraints for one tokenizer (the token trie is built once), cached by canonical text.
#[pyclass(module = "yoco_rs._core", name = "GrammarCompiler", frozen)]
pub struct PyGrammarCompiler {
    inner: Arc<yoco_grammar::GrammarCompiler>,
}

#[pymethods]
impl PyGrammarCompiler {
    #[new]
    #[pyo3(signature = (tokenizer_json, vocab_size, eos_ids, *, time_budget_ms=10_000, max_grammar_size=500_000, initial_lexer_fuel=1_000_000, max_in_flight=4, cache_size=256))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        tokenizer_json: String,
        vocab_size: usize,
        eos_ids: Vec<u32>,
        time_budget_ms: u64,
        max_grammar_size: usize,
        initial_lexer_fuel: u64,
        max_in_flight: usize,
        cache_size: usize,
    ) -> PyResult<Self> {
        let limits = CompileLimits {
            time_budget_ms,
            max_grammar_size,
            initial_lexer_fuel,
            max_in_flight,
            cache_size,
        };
        let inner = py
            .detach(|| {
                let bytes = std::fs::read(&tokenizer_json)
                    .map_err(|e| GrammarError::Tokenizer(format!("{tokenizer_json}: {e}")))?;
                yoco_grammar::GrammarCompiler::from_tokenizer_json(
                    &bytes, vocab_size, &eos_ids, limits,
                )
            })
            .map_err(to_py)?;
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// Compile (or fetch from the cache) a constraint: `kind` is `json`, `json_object`, `regex`,
    /// `choice` (text: a JSON list of strings) or `grammar` (Lark). `ValueError` names what is wrong
    /// (also when the time budget is exceeded); `GrammarBusyError` (a `RuntimeError`) when too many
    /// compile at once.
    fn compile(&self, py: Python<'_>, kind: &str, text: &str) -> PyResult<PyCompiledGrammar> {
        let k = GrammarKind::from_name(kind).ok_or_else(|| {
            PyValueError::new_err(format!("unknown structured output kind {kind:?} (json, json_object, regex, choice, grammar)"))
        })?;
        let inner = &self.inner;
        let g = py
            .detach(|| GrammarSpec::parse(k, text).and_then(|s| inner.compile(&s)))
            .map_err(to_py)?;
        Ok(PyCompiledGrammar { inner: g })
    }

    /// Compiled grammars in the cache.
    #[getter]
    fn cached(&self) -> usize {
        self.inner.cached()
    }

    /// The logits width the masks cover.
    #[getter]
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    /// EOS ids allowed where a grammar accepts.
    #[getter]
    fn eos_ids(&self) -> Vec<u32> {
        self.inner.eos_ids().to_vec()
    }
}

/// A compiled constraint; `MatcherTable.add` starts a sequence's matcher from it.
#[pyclass(module = "yoco_rs._core", name = "CompiledGrammar", frozen)]
pub struct PyCompiledGrammar {
    pub(crate) inner: Arc<yoco_grammar::CompiledGrammar>,
}

/// One matcher per constrained sequence (see `crates/yoco-grammar/src/table.rs`).
#[pyclass(module = "yoco_rs._core", name = "MatcherTable")]
pub struct PyMatcherTable {
    inner: yoco_grammar::MatcherTable,
    job: Option<MaskJob>,
}

type Masks<'py> = (
    Bound<'py, PyArray1<i64>>,
    Bound<'py, PyArray2<i32>>,
    Vec<u64>,
);

fn masks_to_py(py: Python<'_>, m: StepMasks) -> PyResult<Masks<'_>> {
    let n = m.rows.len();
    let a = Array2::from_shape_vec((n, m.words), m.bitmask)
        .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
    Ok((m.rows.into_pyarray(py), a.into_pyarray(py), m.failed))
}

#[pymethods]
impl PyMatcherTable {
    #[new]
    fn new(vocab_size: usize, eos_ids: Vec<u32>) -> Self {
        Self {
            inner: yoco_grammar::MatcherTable::new(vocab_size, &eos_ids),
            job: None,
        }
    }

    /// Start `seq_id`'s matcher at the beginning of `grammar`.
    fn add(&mut self, seq_id: u64, grammar: &PyCompiledGrammar) -> PyResult<()> {
        self.inner.add(seq_id, &grammar.inner).map_err(to_py)
    }

    /// Drop `seq_id`'s matcher; False when it had none.
    fn remove(&mut self, seq_id: u64) -> bool {
        self.inner.remove(seq_id)
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    fn __contains__(&self, seq_id: u64) -> bool {
        self.inner.contains(seq_id)
    }

    /// Words per mask row (`ceil(vocab_size / 32)`).
    #[getter]
    fn words(&self) -> usize {
        self.inner.words()
    }

    /// The error that stopped `seq_id`'s matcher (None if none).
    fn error(&self, seq_id: u64) -> Option<String> {
        self.inner.error(seq_id)
    }

    /// Whether `seq_id`'s output so far is a complete sentence of its grammar.
    fn is_accepting(&self, seq_id: u64) -> PyResult<bool> {
        self.inner.is_accepting(seq_id).map_err(to_py)
    }

    /// Start a step's grammar work in the background and return at once: advance `adv_ids` by
    /// `adv_tokens` (the previous step's tokens), then the masks of the constrained rows among
    /// `seq_ids` (this step's sampling rows, in order); `wait_masks` collects them.
    #[pyo3(signature = (seq_ids, adv_ids=None, adv_tokens=None))]
    fn start_masks(
        &mut self,
        seq_ids: PyReadonlyArray1<'_, u64>,
        adv_ids: Option<PyReadonlyArray1<'_, u64>>,
        adv_tokens: Option<PyReadonlyArray1<'_, i32>>,
    ) -> PyResult<()> {
        let ids = match &adv_ids {
            Some(a) => a.as_slice()?.to_vec(),
            None => vec![],
        };
        let toks: Vec<u32> = match &adv_tokens {
            Some(a) => a.as_slice()?.iter().map(|&t| t.max(0) as u32).collect(),
            None => vec![],
        };
        if ids.len() != toks.len() {
            return Err(PyValueError::new_err(format!(
                "adv_ids and adv_tokens differ in length: {} vs {}",
                ids.len(),
                toks.len()
            )));
        }
        self.job = Some(self.inner.start_masks(seq_ids.as_slice()?, &ids, &toks));
        Ok(())
    }

    /// `(rows int64[C], bitmask int32[C, words], failed list[int])` of the job `start_masks` started
    /// (GIL released while waiting): `rows` are positions into that call's `seq_ids`; `failed` the
    /// sequences whose grammar failed while the job advanced them.
    fn wait_masks<'py>(&mut self, py: Python<'py>) -> PyResult<Masks<'py>> {
        let job = self
            .job
            .take()
            .ok_or_else(|| PyRuntimeError::new_err("wait_masks without start_masks"))?;
        let m = py.detach(|| job.wait());
        masks_to_py(py, m)
    }

    /// `start_masks` + `wait_masks`.
    fn masks<'py>(
        &mut self,
        py: Python<'py>,
        seq_ids: PyReadonlyArray1<'py, u64>,
    ) -> PyResult<Masks<'py>> {
        let ids = seq_ids.as_slice()?;
        let inner = &self.inner;
        let m = py.detach(|| inner.masks(ids));
        masks_to_py(py, m)
    }

    /// Advance the matchers of `seq_ids` by `tokens` (rows without a matcher skipped); returns the ids
    /// whose grammar rejected the token.
    fn advance(
        &mut self,
        py: Python<'_>,
        seq_ids: PyReadonlyArray1<'_, u64>,
        tokens: PyReadonlyArray1<'_, i32>,
    ) -> PyResult<Vec<u64>> {
        let (ids, toks) = (seq_ids.as_slice()?, tokens.as_slice()?);
        if ids.len() != toks.len() {
            return Err(PyValueError::new_err(format!(
                "seq_ids and tokens differ in length: {} vs {}",
                ids.len(),
                toks.len()
            )));
        }
        let toks: Vec<u32> = toks.iter().map(|&t| t.max(0) as u32).collect();
        let inner = &self.inner;
        Ok(py.detach(|| inner.advance(ids, &toks)))
    }
}

/// `logits[rows[i], t] = -inf` for every token `t` that row `i` of `bitmask` (`[C, words]` int32)
/// disallows, in place on a C-contiguous float32 `[X, V]` array (host logits); GIL released.
#[pyfunction]
pub fn mask_logits(
    py: Python<'_>,
    mut logits: PyReadwriteArray2<'_, f32>,
    rows: PyReadonlyArray1<'_, i64>,
    bitmask: PyReadonlyArray2<'_, i32>,
) -> PyResult<()> {
    let vocab = logits.as_array().shape()[1];
    let words = bitmask.as_array().shape()[1];
    let rows: Vec<usize> = rows
        .as_slice()?
        .iter()
        .map(|&r| usize::try_from(r).unwrap_or(usize::MAX))
        .collect();
    let bm = bitmask.as_slice()?;
    let l = logits.as_slice_mut()?;
    py.detach(|| yoco_grammar::mask_logits(l, vocab, &rows, bm, words))
        .map_err(to_py)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(mask_logits, m)?)?;
    m.add("GrammarBusyError", m.py().get_type::<GrammarBusyError>())?;
    m.add_class::<PyGrammarCompiler>()?;
    m.add_class::<PyCompiledGrammar>()?;
    m.add_class::<PyMatcherTable>()
}
