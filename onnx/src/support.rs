//! One row of the support table: an operator the importer lowers and what of it.

/// One supported operator: its name and what of it is supported.
#[derive(Clone, Copy, Debug)]
pub struct Support {
    /// The operator (`Conv`).
    pub op: &'static str,
    /// Attributes, modes and dtypes covered, and what is not.
    pub notes: &'static str,
}

impl Support {
    /// An entry.
    pub const fn new(op: &'static str, notes: &'static str) -> Support {
        Support { op, notes }
    }
}
