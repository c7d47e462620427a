//! Layers: Linear, activations, LayerNorm, Dropout, Sequential.
