//! # ndfuse-codegen-cuda
//!
//! The CUDA code generator: it will turn the same kernel descriptions the CPU codegen
//! consumes (`ndfuse_ir::Kernel`) into CUDA C and compile them with NVRTC through cudarc.
//! Nothing is generated yet: the runtime reports the CUDA backend as "not built yet in
//! this version", and this crate exists so the workspace has its final shape.
