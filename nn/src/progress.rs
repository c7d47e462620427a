//! The training loop's progress bar: loss and throughput.
