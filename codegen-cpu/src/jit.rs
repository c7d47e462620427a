//! The JIT: compiles a lowered kernel for the host with Cranelift, owns the code memory,
//! and is the only place that turns it into a callable function and calls it.

use crate::error::CodegenError;
use crate::libcalls;
use crate::lower;
use crate::support::supports;
use cranelift_codegen::isa::OwnedTargetIsa;
use cranelift_codegen::settings::{self, Configurable};
use cranelift_frontend::FunctionBuilderContext;
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{default_libcall_names, Linkage, Module, ModuleError};
use ndfuse_ir::{Buffer, HostArray, Kernel};
use std::fmt;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The machine-level type of every kernel (see the crate docs for the ABI). `unsafe`
/// because the code trusts its arguments: the pointers must back the kernel's buffers.
type KernelFn = unsafe extern "C" fn(ptrs: *const *mut u8, start: i64, end: i64);

/// The host ISA, built once: detecting CPU features and building the backend costs
/// more than compiling a small kernel.
fn host_isa() -> Result<OwnedTargetIsa, String> {
    static ISA: OnceLock<Result<OwnedTargetIsa, String>> = OnceLock::new();
    ISA.get_or_init(|| {
        let mut flags = settings::builder();
        let set = |flags: &mut settings::Builder, k: &str, v: &str| {
            flags.set(k, v).map_err(|e| format!("setting {k}={v}: {e}"))
        };
        set(&mut flags, "opt_level", "speed")?;
        // cranelift-jit requires these: libcalls may be anywhere in the address space.
        set(&mut flags, "use_colocated_libcalls", "false")?;
        set(&mut flags, "is_pic", "false")?;
        let isa = cranelift_native::builder().map_err(|e| format!("host not supported: {e}"))?;
        isa.finish(settings::Flags::new(flags))
            .map_err(|e| format!("building the host ISA: {e}"))
    })
    .clone()
}

/// A kernel compiled to machine code, ready to run on host arrays.
///
/// It is `Send + Sync`: JIT code only reads its inputs and writes the range of outputs
/// it is given, so threads may later run disjoint ranges of one compiled kernel.
pub struct CompiledKernel {
    name: String,
    clif: String,
    compile_time: Duration,
    inputs: Vec<Buffer>,
    outputs: Vec<Buffer>,
    /// The unit of a range: rows for a kernel with reduce axes, positions otherwise.
    unit: Unit,
    /// How many units a whole run covers (`rows()` or the domain's `numel()`).
    extent: usize,
    entry: KernelFn,
    /// Behind a mutex only to make the kernel `Sync` (`JITModule` is not); it is never
    /// locked, only freed when the kernel is dropped.
    _code: Mutex<CodeMemory>,
}

impl fmt::Debug for CompiledKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompiledKernel")
            .field("name", &self.name)
            .field("compile_time", &self.compile_time)
            .field("inputs", &self.inputs)
            .field("outputs", &self.outputs)
            .field("unit", &self.unit)
            .field("extent", &self.extent)
            .finish_non_exhaustive()
    }
}

/// What the `start..end` of a kernel's function count (see the crate docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Unit {
    /// Row-major positions of the domain (kernels without reduce axes).
    Positions,
    /// Rows, in row-major order of the kept axes (kernels with reduce axes).
    Rows,
}

impl Unit {
    fn name(self) -> &'static str {
        match self {
            Unit::Positions => "the domain's",
            Unit::Rows => "the kernel's rows",
        }
    }
}

/// A JIT module whose code memory is freed when it is dropped (cranelift-jit leaks it
/// otherwise), on success and error paths alike.
struct CodeMemory {
    module: Option<JITModule>,
}

impl CodeMemory {
    fn module(&mut self) -> &mut JITModule {
        self.module
            .as_mut()
            .expect("the module is only taken by drop")
    }
}

impl Drop for CodeMemory {
    fn drop(&mut self) {
        if let Some(module) = self.module.take() {
            // SAFETY: the only function pointer obtained from this module is the
            // `entry` of the `CompiledKernel` that owns this `CodeMemory` (or none, when
            // compilation failed). It is private, never handed out, and only called
            // through `&CompiledKernel`; dropping needs exclusive ownership, so no call
            // is running and none can follow.
            unsafe { module.free_memory() };
        }
    }
}

/// Compiles `kernel` to machine code for the host.
///
/// Returns [`CodegenError::Unsupported`] when [`supports`] refuses the kernel and
/// [`CodegenError::Cranelift`] when Cranelift fails (a bug in lowering, reported with
/// the annotated function).
pub fn compile(kernel: &Kernel) -> Result<CompiledKernel, CodegenError> {
    let started = Instant::now();
    let unsupported = |reason: String| CodegenError::Unsupported {
        kernel: kernel.name.clone(),
        reason,
    };
    supports(kernel).map_err(unsupported)?;
    let cranelift = |message: String| CodegenError::Cranelift {
        kernel: kernel.name.clone(),
        message,
    };
    let isa = host_isa().map_err(cranelift)?;

    let mut builder = JITBuilder::with_isa(isa, default_libcall_names());
    builder.symbols(libcalls::symbols());
    let mut code = CodeMemory {
        module: Some(JITModule::new(builder)),
    };
    let module = code.module();

    let mut ctx = module.make_context();
    let mut fctx = FunctionBuilderContext::new();
    let sig = lower::kernel_signature(module);
    let id = module
        .declare_function(&kernel.name, Linkage::Export, &sig)
        .map_err(|e| cranelift(e.to_string()))?;
    let imports = lower::lower(kernel, module, &mut ctx.func, &mut fctx).map_err(cranelift)?;
    // The text names imports only by id; a comment legend says which function each is.
    let mut clif = String::new();
    for (name, id) in imports {
        clif.push_str(&format!("; u0:{} = {name}\n", id.as_u32()));
    }
    clif.push_str(&ctx.func.display().to_string());
    module.define_function(id, &mut ctx).map_err(|e| match e {
        ModuleError::Compilation(err) => cranelift(cranelift_codegen::print_errors::pretty_error(
            &ctx.func, err,
        )),
        other => cranelift(other.to_string()),
    })?;
    module
        .finalize_definitions()
        .map_err(|e| cranelift(e.to_string()))?;
    let entry = entry_point(module.get_finalized_function(id));
    let (unit, extent) = if kernel.reduce_axes.is_empty() {
        (Unit::Positions, kernel.domain.numel())
    } else {
        (Unit::Rows, kernel.rows())
    };

    Ok(CompiledKernel {
        name: kernel.name.clone(),
        clif,
        compile_time: started.elapsed(),
        inputs: kernel.inputs.clone(),
        outputs: kernel.outputs.clone(),
        unit,
        extent,
        entry,
        _code: Mutex::new(code),
    })
}

/// `1 input`, `2 inputs`.
fn count(n: usize, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
}

/// Whether `array` can back `buffer`: same dtype, same number of elements.
fn check_array(role: &str, k: usize, array: &HostArray, buffer: &Buffer) -> Result<(), String> {
    if array.dtype() != buffer.dtype {
        return Err(format!(
            "{role} {k} is {}, the kernel needs {}",
            array.dtype(),
            buffer.dtype
        ));
    }
    if array.len() != buffer.len {
        return Err(format!(
            "{role} {k} has {} elements, the kernel needs {}",
            array.len(),
            buffer.len
        ));
    }
    Ok(())
}

/// The finalized code of a kernel as a callable function.
fn entry_point(code: *const u8) -> KernelFn {
    // SAFETY: `code` is the finalized, executable code of a function that `lower`
    // defined with `kernel_signature`, i.e. (pointer, i64, i64) -> () in the host's
    // default calling convention, which is `extern "C"`. Both are pointer-sized.
    unsafe { std::mem::transmute::<*const u8, KernelFn>(code) }
}

/// Runs the kernel's code over units (positions, or rows) `[start, end)`. Only
/// `run_range` calls it, after the checks its SAFETY comment relies on.
fn invoke(entry: KernelFn, ptrs: &[*mut u8], start: i64, end: i64) {
    // SAFETY: `run_range` has checked, before building `ptrs`, that there is one pointer
    // per kernel buffer (inputs, then outputs), each to an array of the buffer's dtype
    // and exact length, outputs borrowed mutably and so distinct from each other and
    // from the inputs, and that `0 <= start <= end <= extent`, where the extent is
    // `numel` (positions) or, for a kernel with reduce axes, `rows()` (rows). `supports`
    // proved every load of every domain position inside its buffer; a row `r < rows`
    // only visits the positions of that row (and a row-level load only happens when
    // rows are not empty, so the domain is not). Stores go to a position `< numel` of
    // outputs of `numel` elements, or to `r < rows` of per-row outputs of `rows`
    // elements. Bool outputs receive only 0 or 1.
    unsafe { entry(ptrs.as_ptr(), start, end) }
}

impl CompiledKernel {
    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The Cranelift IR of the kernel as generated, before Cranelift's optimisations:
    /// for dumps (`NDFUSE_DEBUG=4`) and snapshot tests. Imported math functions appear
    /// as `u0:<id>`; leading `;` comment lines name them. The same kernel always gives
    /// the same text.
    pub fn clif(&self) -> &str {
        &self.clif
    }

    /// How long [`compile`] took, from checks to finalized code.
    pub fn compile_time(&self) -> Duration {
        self.compile_time
    }

    /// Runs the kernel over its whole domain (every row, for a kernel with reduce axes).
    ///
    /// `inputs` and `outputs` must match the kernel's buffers in number, dtype and
    /// length (shapes are not checked: buffers are flat); otherwise
    /// [`CodegenError::Args`] names the first argument that does not, and nothing runs.
    pub fn run(
        &self,
        inputs: &[&HostArray],
        outputs: &mut [&mut HostArray],
    ) -> Result<(), CodegenError> {
        self.run_range(inputs, outputs, 0, self.extent)
    }

    /// Runs the kernel over row-major positions `[start, end)` of its domain only; the
    /// rest of each output is left as it was. Checks the arguments as [`Self::run`] does
    /// and `start <= end <= numel`.
    ///
    /// For a kernel with reduce axes, `start..end` are **rows** instead (row-major over
    /// the kept axes, `end <= Kernel::rows()`): each row in the range is reduced whole and
    /// all of its outputs are written (every position of the row, or its one per-row
    /// element); other rows are left as they were.
    pub fn run_range(
        &self,
        inputs: &[&HostArray],
        outputs: &mut [&mut HostArray],
        start: usize,
        end: usize,
    ) -> Result<(), CodegenError> {
        let bad = |detail: String| CodegenError::Args {
            kernel: self.name.clone(),
            detail,
        };
        if inputs.len() != self.inputs.len() {
            return Err(bad(format!(
                "expected {}, got {}",
                count(self.inputs.len(), "input"),
                inputs.len()
            )));
        }
        if outputs.len() != self.outputs.len() {
            return Err(bad(format!(
                "expected {}, got {}",
                count(self.outputs.len(), "output"),
                outputs.len()
            )));
        }
        for (k, (array, buffer)) in inputs.iter().zip(&self.inputs).enumerate() {
            check_array("input", k, array, buffer).map_err(bad)?;
        }
        for (k, (array, buffer)) in outputs.iter().zip(&self.outputs).enumerate() {
            check_array("output", k, array, buffer).map_err(bad)?;
        }
        if start > end || end > self.extent {
            return Err(bad(format!(
                "range {start}..{end} is not within {} 0..{}",
                self.unit.name(),
                self.extent
            )));
        }
        if start == end {
            return Ok(());
        }
        // Input pointers are typed `*mut` only because the ABI has one pointer array;
        // the code never writes through them.
        let ptrs: Vec<*mut u8> = inputs
            .iter()
            .map(|a| a.storage().as_ptr().cast_mut())
            .chain(outputs.iter_mut().map(|a| a.storage_mut().as_mut_ptr()))
            .collect();
        let as_i64 = |v: usize| i64::try_from(v).expect("numel fits i64: checked by supports()");
        invoke(self.entry, &ptrs, as_i64(start), as_i64(end));
        Ok(())
    }
}
