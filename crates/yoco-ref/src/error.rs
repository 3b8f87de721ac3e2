//! One error type: a message that says what was wrong where (step, row, request, token, slot).

use std::fmt;

/// A failed check or invalid input: the message is the whole report (step, row, request, token,
/// slot), since a test that fails prints nothing else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error(pub String);

impl Error {
    /// An error carrying `s` as its message.
    pub fn msg(s: impl Into<String>) -> Self {
        Error(s.into())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl From<candle_core::Error> for Error {
    fn from(e: candle_core::Error) -> Self {
        Error(format!("candle: {e}"))
    }
}

impl From<yoco_core::Error> for Error {
    fn from(e: yoco_core::Error) -> Self {
        Error(format!("yoco-core: {e}"))
    }
}

/// The crate's fallible return type.
pub type Result<T> = std::result::Result<T, Error>;

/// `return Err(Error(format!(...)))`
#[macro_export]
macro_rules! bail {
    ($($t:tt)*) => { return Err($crate::error::Error(format!($($t)*))) };
}
