//! The signals that stop a server: [`shutdown_signal`] (either, for the mock server binary) and
//! [`stop_signal`] (which one, for `yoco-serve`'s drain: SIGTERM lets in-flight requests finish for
//! `--shutdown-timeout` seconds, SIGINT aborts them at once), written once for the bindings'
//! `serve_http` and the mock server binary.

/// Which signal asked the server to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopSignal {
    /// SIGINT (Ctrl-C): stop now.
    Interrupt,
    /// SIGTERM (an orchestrator's stop): drain first.
    Terminate,
}

/// Resolves on the first SIGINT or SIGTERM, saying which.
///
/// # Panics
/// When the SIGTERM handler cannot be installed (no signal support in the runtime: build it with
/// `enable_all`).
pub async fn stop_signal() -> StopSignal {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => StopSignal::Interrupt,
        _ = term.recv() => StopSignal::Terminate,
    }
}

/// Resolves on the first SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    stop_signal().await;
}
