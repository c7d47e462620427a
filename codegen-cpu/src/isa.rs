//! The host's instruction set: the one target every JIT module of this crate compiles
//! for (the kernels' code, the shared math, and the FMA question of the inline math).

use cranelift_codegen::isa::OwnedTargetIsa;
use cranelift_codegen::settings::{self, Configurable};
use std::sync::OnceLock;

/// The host ISA, built once: detecting CPU features and building the backend costs
/// more than compiling a small kernel.
pub(crate) fn host_isa() -> Result<OwnedTargetIsa, String> {
    static ISA: OnceLock<Result<OwnedTargetIsa, String>> = OnceLock::new();
    ISA.get_or_init(|| {
        let mut flags = settings::builder();
        let set = |flags: &mut settings::Builder, k: &str, v: &str| {
            flags.set(k, v).map_err(|e| format!("setting {k}={v}: {e}"))
        };
        set(&mut flags, "opt_level", "speed")?;
        // Cranelift's IR verifier runs in debug builds (every test suite), where it
        // catches a lowering bug at its source; release builds skip it: about 15% of a
        // small kernel's compile time.
        let verify = if cfg!(debug_assertions) {
            "true"
        } else {
            "false"
        };
        set(&mut flags, "enable_verifier", verify)?;
        // cranelift-jit requires these: libcalls may be anywhere in the address space.
        set(&mut flags, "use_colocated_libcalls", "false")?;
        set(&mut flags, "is_pic", "false")?;
        let isa = cranelift_native::builder().map_err(|e| format!("host not supported: {e}"))?;
        isa.finish(settings::Flags::new(flags))
            .map_err(|e| format!("building the host ISA: {e}"))
    })
    .clone()
}
