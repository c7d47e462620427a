//! The `NDFUSE_*` environment variables that are not configuration keys: the
//! configuration's check of the environment lets them through.

/// The variable naming the configuration file.
pub const CONFIG_VAR: &str = "NDFUSE_CONFIG";

/// `NDFUSE_*` variables that are not keys: the file's path and the test suites' switches.
pub(crate) const NOT_KEYS: &[&str] = &[
    CONFIG_VAR,
    "NDFUSE_REQUIRE_CUDA",
    "NDFUSE_REQUIRE_NVRTC",
    // Tests that need a data set from Debian's packages (Fashion-MNIST) fail without it.
    "NDFUSE_REQUIRE_DATA",
    // The pretrained models' folder (scripts/fetch_models.sh) and ndfuse-models' switch;
    // the ONNX files (scripts/fetch_onnx.sh), ndfuse-onnx's switch and its suite's filters.
    "NDFUSE_MODELS",
    "NDFUSE_REQUIRE_MODELS",
    "NDFUSE_ONNX",
    "NDFUSE_REQUIRE_ONNX",
    "NDFUSE_ONNX_ONLY",
    "NDFUSE_ONNX_VERBOSE",
    // Whether nn's progress bar draws (ndfuse_nn::progress), read by the training loop.
    "NDFUSE_PROGRESS",
    // Where NVRTC finds the CUDA headers (ndfuse_codegen_cuda::include_dirs), read
    // before any configuration exists.
    "NDFUSE_CUDA_INCLUDE",
    // The test harness's own settings (scripts/gpu-check.sh, .ci/run).
    "NDFUSE_CI_VENV",
    // Whether the CPU code generator's inline math uses FMA (ndfuse_codegen_cpu::use_fma),
    // read once per process when the host ISA is built.
    "NDFUSE_CPU_FMA",
    // Which vector width the CPU kernels use (ndfuse_codegen_cpu::wide::tier), read once
    // per process like NDFUSE_CPU_FMA.
    "NDFUSE_CPU_WIDE",
    // `emitted`: the CUDA backend's matrix products never go to cuBLASLt (runtime's
    // cublas module), read once per device.
    "NDFUSE_CUDA_GEMM",
    // How many cases the fuzz suites run (tests/tests/fuzz_support).
    "NDFUSE_FUZZ_CASES",
    // The bound on one MPI collective (ndfuse_train::MpiRanks), read where MPI starts.
    "NDFUSE_MPI_TIMEOUT_S",
];
