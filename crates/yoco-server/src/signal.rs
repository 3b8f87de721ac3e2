//! [`shutdown_signal`]: the future a server binary hands `serve_router` to stop on SIGINT (Ctrl-C)
//! or SIGTERM (an orchestrator's stop), written once for the bindings' `serve_http` and the mock
//! server binary.

/// Resolves on the first SIGINT or SIGTERM.
///
/// # Panics
/// When the SIGTERM handler cannot be installed (no signal support in the runtime: build it with
/// `enable_all`).
pub async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
