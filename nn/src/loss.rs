//! Losses and metrics: mean-squared error, cross-entropy with logits, accuracy.
