//! Optimisers: SGD (momentum, Nesterov), Adam, AdamW; each step one fused graph.
