//! A failed command: the one line it prints on stderr (the exit status is 1).

use ndfuse::{Error, ExprError};

/// A failure: the one line printed on stderr.
#[derive(Debug)]
pub struct Failure(pub String);

impl Failure {
    pub fn plain(msg: impl std::fmt::Display) -> Failure {
        Failure(format!("error: {msg}"))
    }

    /// An error at a position of the expression `src`.
    pub fn expr(src: &str, e: &ExprError) -> Failure {
        Failure(format!("error at column {}: {}", e.column(src), e.message))
    }

    /// An error of [`Expr::parse`].
    pub fn parse(e: Error) -> Failure {
        match e {
            Error::Expr { column, message } => {
                Failure(format!("error at column {column}: {message}"))
            }
            other => Failure::plain(other.reason()),
        }
    }
}

impl From<String> for Failure {
    fn from(s: String) -> Failure {
        Failure::plain(s)
    }
}
