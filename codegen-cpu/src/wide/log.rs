//! The log family on wide registers: log and log1p.
