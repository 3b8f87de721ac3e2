//! One error type: a message that says what was wrong where (step, row, request, token, slot).

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error(pub String);

impl Error {
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

pub type Result<T> = std::result::Result<T, Error>;

/// `return Err(Error(format!(...)))`
#[macro_export]
macro_rules! bail {
    ($($t:tt)*) => { return Err($crate::error::Error(format!($($t)*))) };
}
