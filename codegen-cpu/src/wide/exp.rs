//! The exp family on wide registers: exp, expm1, tanh, sigmoid and erf.
