//! The training loop: steps, epochs, evaluation, history.
