//! Parameters and optimiser state saved to and loaded from safetensors files, atomically.
