//! The closed choices of the command line (clap value enums) and what each means to
//! the library.

use clap::ValueEnum;
use ndfuse::{BackendKind, DType};

/// `--backend`.
#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum Backend {
    Auto,
    Cpu,
    Cuda,
    Interp,
}

impl From<Backend> for BackendKind {
    fn from(b: Backend) -> BackendKind {
        match b {
            Backend::Auto => BackendKind::Auto,
            Backend::Cpu => BackendKind::Cpu,
            Backend::Cuda => BackendKind::Cuda,
            Backend::Interp => BackendKind::Interp,
        }
    }
}

/// `--dtype`: the float dtypes a context may default to.
#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum FloatDType {
    F16,
    Bf16,
    F32,
    F64,
}

impl From<FloatDType> for DType {
    fn from(d: FloatDType) -> DType {
        match d {
            FloatDType::F16 => DType::F16,
            FloatDType::Bf16 => DType::BF16,
            FloatDType::F32 => DType::F32,
            FloatDType::F64 => DType::F64,
        }
    }
}
