//! Parameters: named tensors whose storage persists across steps.
