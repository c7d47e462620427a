//! A worker: a replica trainer on a thread bound to its device, driven by messages.
