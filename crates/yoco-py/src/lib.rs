//! `yoco_rs._core`: the thin PyO3 boundary over `yoco-core`. No engine logic lives here.
//!
//! Per step the engine makes O(1) calls (`schedule`, `update`) that create O(1) Python objects; all
//! per-token/per-block data crosses as flat numpy buffers moved out of or borrowed from Rust.

mod arrays;
mod convert;
mod cpu_linear; // yoco-cpu binding (the row-invariant CPU linear layer)
mod engine_loop; // EngineLoop: the Rust step loop under Engine/AsyncEngine
mod errors;
mod grammar; // yoco-grammar binding (structured outputs)
mod mock;
mod plan;
mod scheduler;
mod serve; // the Rust serving path over the Python executor
mod serve_media; // its media seam (images, audio, transcriptions) over the Python processor
mod serve_sampling; // its masks, logprob arrays and structured-output settings
mod step_executor; // the Python executor behind a Rust step loop
mod text; // yoco-text binding (engine)

use pyo3::prelude::*;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("CapacityError", m.py().get_type::<errors::CapacityError>())?;
    m.add("EngineDied", m.py().get_type::<errors::EngineDied>())?;
    m.add_class::<scheduler::Scheduler>()?;
    m.add_class::<plan::StepPlan>()?;
    m.add_class::<plan::StepOutcome>()?;
    m.add_class::<mock::MockExecutor>()?;
    m.add("NOT_FINISHED", yoco_core::sched::NOT_FINISHED)?;
    for (name, r) in [
        ("FINISH_STOP", yoco_core::sched::FinishReason::Stop),
        (
            "FINISH_STOP_TOKEN",
            yoco_core::sched::FinishReason::StopToken,
        ),
        ("FINISH_LENGTH", yoco_core::sched::FinishReason::Length),
        ("FINISH_ABORT", yoco_core::sched::FinishReason::Abort),
        (
            "FINISH_STOP_STRING",
            yoco_core::sched::FinishReason::StopString,
        ),
    ] {
        m.add(name, r as u8)?;
    }
    m.add_function(wrap_pyfunction!(serve::serve_http, m)?)?;
    m.add_class::<serve_sampling::PyStepMasks>()?;
    m.add_class::<engine_loop::PyEngineLoop>()?;
    text::register(m)?; // engine: TextBatch
    grammar::register(m)?; // structured outputs: GrammarCompiler, CompiledGrammar, MatcherTable
    cpu_linear::register(m)?; // linear_f32, linear_bf16, cpu_linear_available
    Ok(())
}
