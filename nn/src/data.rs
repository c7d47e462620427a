//! Data sets of feature and label arrays (.npy), seeded shuffled mini-batches and a prefetch thread.
