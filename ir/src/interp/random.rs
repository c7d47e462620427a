//! Random number sources: the reference values of [`Op::RandomUniform`](crate::Op), a
//! pure function of the key and each element's row-major position in the op's own shape
//! ([`crate::op::random_uniform`]), for whole nodes and for the positions a kernel's
//! index map reaches.

use super::vals::Vals;
use crate::op::random_uniform;

/// The key of a random op: its one element (a 0-d i64 operand, or in a kernel an i64
/// value replicated along the positions evaluated).
pub(super) fn key_of(key: &Vals) -> i64 {
    match key {
        Vals::I(k) => *k
            .first()
            .expect("a random op's key has an element (infer checks it is 0-d i64)"),
        _ => panic!("a random op's key is not an integer; infer refuses that (a bug)"),
    }
}

/// The values at the given positions (row-major indices of the op's own shape), as f64
/// (each is an exact f32).
pub(super) fn uniform_at(key: i64, positions: impl Iterator<Item = usize>) -> Vals {
    Vals::F(
        positions
            .map(|i| f64::from(random_uniform(key, i as u64)))
            .collect(),
    )
}
