//! The core's one error type. `yoco-py` maps each variant to a specific Python exception.

/// Errors the core reports to its caller. Invariant violations are bugs and panic instead.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum Error {
    /// A configuration value is invalid; the message names the field and what would work.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A request is invalid (empty prompt, too long, duplicate id, ...); the message says why.
    #[error("invalid request: {0}")]
    Request(String),
    /// The KV pool can never hold what was asked (e.g. a prompt longer than the whole pool).
    #[error("KV capacity: {0}")]
    Capacity(String),
}

/// The core's fallible return type: every public entry that can reject input returns this, so
/// `yoco-py` has one place to turn failures into Python exceptions.
pub type Result<T> = std::result::Result<T, Error>;
