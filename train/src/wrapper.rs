//! ParallelWrapper: a model replicated over the devices, gradients or parameters averaged by a fused kernel.
