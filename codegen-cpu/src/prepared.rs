//! What a kernel compiles to, decided before any code is written (the wide path's
//! plan, a split kernel's phases, shared math), and the lowering of its functions into
//! Cranelift IR: shared by the JIT's compile and by its check that another kernel
//! lowers to the same code (`CompiledKernel::rebind`).

use crate::blocks::{self, BlockPlan};
use crate::error::CodegenError;
use crate::isa::host_isa;
use crate::libcalls;
use crate::lower::layout::{Phase, SplitLayout};
use crate::lower::{self, kernel_signature};
use crate::support::supports;
use crate::wide::{self, Tier};
use cranelift_frontend::FunctionBuilderContext;
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{default_libcall_names, Linkage, Module};
use ndfuse_ir::Kernel;

/// The functions of a kernel before optimisation, with each one's legend of imports.
pub(crate) type ClifParts = Vec<(String, cranelift_codegen::ir::Function)>;

/// What a kernel compiles to, decided before any code is written: the wide path's
/// plan, the phases of a split kernel, whether small-kernel math is shared. The same
/// for [`compile_with`] and for [`CompiledKernel::rebind`]'s check.
pub(crate) struct Prepared {
    pub(crate) tier: Option<Tier>,
    pub(crate) block_plan: Option<BlockPlan>,
    pub(crate) shared_math: bool,
    pub(crate) layout: Option<SplitLayout>,
    pub(crate) phases: Vec<Phase>,
}

impl Prepared {
    pub(crate) fn of(kernel: &Kernel, tier: Option<Tier>) -> Result<Prepared, CodegenError> {
        let unsupported = |reason: String| CodegenError::Unsupported {
            kernel: kernel.name.clone(),
            reason,
        };
        supports(kernel).map_err(unsupported)?;
        // The wide routines give the 128-bit code's bits with fused multiply-adds only:
        // without them (`NDFUSE_CPU_FMA=0`) there is no wide path, as `wide::tier` says.
        let tier = tier.filter(|t| t.available() && crate::vmath::builder::use_fma());
        let block_plan = tier.and_then(|t| blocks::plan(kernel, t));
        // Small kernels call the shared copies of the inline math (see `shared_math`).
        let shared_math = block_plan.is_none() && crate::shared_math::applies(kernel);
        let layout = SplitLayout::of(kernel);
        let phases = layout.as_ref().map_or(vec![Phase::Whole], |l| l.phases());
        Ok(Prepared {
            tier,
            block_plan,
            shared_math,
            layout,
            phases,
        })
    }

    /// A JIT module with the symbols the kernel's code may import.
    pub(crate) fn module(&self, kernel: &Kernel) -> Result<JITModule, CodegenError> {
        let cranelift = |message: String| CodegenError::Cranelift {
            kernel: kernel.name.clone(),
            message,
        };
        let isa = host_isa().map_err(cranelift)?;
        let mut builder = JITBuilder::with_isa(isa, default_libcall_names());
        builder.symbols(libcalls::symbols());
        if self.shared_math {
            for (name, addr) in crate::shared_math::symbols_for(kernel).map_err(cranelift)? {
                builder.symbol(name, addr as *const u8);
            }
        }
        // Row programs may call the wide routines on rows held in their row cache.
        if let Some(t) = self.tier {
            for (name, addr) in wide::symbols(t) {
                builder.symbol(name, addr as *const u8);
            }
        }
        Ok(JITModule::new(builder))
    }

    /// Comment lines before the functions: the steps of a kernel on the wide path.
    pub(crate) fn preface(&self) -> String {
        self.block_plan
            .as_ref()
            .map_or(String::new(), |p| p.describe())
    }

    /// Lowers every function of `kernel` (its phases, or the segments of its blocks)
    /// into `module`, calling `define` on each as it stands in `ctx` (with its id and
    /// the names of its imports by id); returns them as generated.
    pub(crate) fn lower_functions(
        &self,
        kernel: &Kernel,
        module: &mut JITModule,
        mut define: impl FnMut(
            &mut JITModule,
            &mut cranelift_codegen::Context,
            cranelift_module::FuncId,
            &std::collections::HashMap<u32, &'static str>,
        ) -> Result<(), CodegenError>,
    ) -> Result<ClifParts, CodegenError> {
        let cranelift = |message: String| CodegenError::Cranelift {
            kernel: kernel.name.clone(),
            message,
        };
        let functions: Vec<(&Kernel, Phase)> = match &self.block_plan {
            Some(plan) => plan.segments.iter().map(|k| (k, Phase::Whole)).collect(),
            None => self.phases.iter().map(|&p| (kernel, p)).collect(),
        };
        let mut ctx = module.make_context();
        let mut fctx = FunctionBuilderContext::new();
        let sig = kernel_signature(module);
        let mut parts = Vec::with_capacity(functions.len());
        for &(k, phase) in &functions {
            let name = format!("{}{}", k.name, phase.suffix());
            let id = module
                .declare_function(&name, Linkage::Export, &sig)
                .map_err(|e| cranelift(e.to_string()))?;
            module.clear_context(&mut ctx);
            let imports = lower::lower(
                k,
                phase,
                self.shared_math,
                self.tier,
                module,
                &mut ctx.func,
                &mut fctx,
            )
            .map_err(cranelift)?;
            // The text names imports only by id; a comment legend says which function
            // each is.
            let mut legend = String::new();
            let names: std::collections::HashMap<u32, &'static str> = imports
                .iter()
                .map(|&(name, id)| (id.as_u32(), name))
                .collect();
            for (name, id) in imports {
                legend.push_str(&format!("; u0:{} = {name}\n", id.as_u32()));
            }
            parts.push((legend, ctx.func.clone()));
            define(module, &mut ctx, id, &names)?;
        }
        Ok(parts)
    }
}
