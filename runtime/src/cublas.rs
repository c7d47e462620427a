//! cuBLASLt for the matrix products it can take, on a GPU that has the library.
//!
//! The emitted GEMMs (`codegen-cuda`'s `emit/gemm*.rs`) take every product, but on an
//! H100 they reach about half of the f32 FMA peak and a fifth of the tensor cores', where
//! NVIDIA's own kernels reach most of both. So a contraction kernel whose operands
//! cuBLASLt can read goes to `cublasLtMatmul` (operands f32, f16 or bf16 with f32
//! accumulation: `CUBLAS_COMPUTE_32F`, never TF32, so f32 products keep f32's
//! precision): each operand has a unit stride on one of its two matrix axes, its batch
//! axes collapse into one stride (0 where broadcast), and it has no prologue. A kernel
//! whose body only stores the product (in the operands' dtype or f32) has cuBLASLt
//! write the output; any other epilogue runs as the kernel's own element-wise code over
//! a product buffer of f32, one more pass over memory. The rest, and every product when
//! the library is missing or declines (no algorithm for the layout), keeps the emitted
//! GEMM. `NDFUSE_CUDA_GEMM=emitted` turns this path off.
//!
//! Row-major `C[M, N] = A[M, K] B[K, N]` is the column-major `C^T[N, M] = B^T A^T`:
//! cuBLASLt's first operand is our right one, its second our left one.

use crate::error::RuntimeError;
use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use ndfuse_ir::{DType, Expr, Kernel, View};
use std::ffi::c_void;
use std::sync::Arc;

/// One operand as cuBLASLt reads it: a column-major `rows x cols` matrix with leading
/// dimension `ld` (transposed by the op when `trans`), `batch_stride` elements apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LtOperand {
    /// Index into the kernel's inputs.
    pub input: usize,
    /// Offset of element 0 in the buffer, in elements.
    pub offset: usize,
    pub trans: bool,
    pub rows: u64,
    pub cols: u64,
    pub ld: i64,
    pub batch_stride: i64,
}

impl LtProduct {
    /// The kernel input holding the epilogue's bias, if any.
    pub(crate) fn bias(&self) -> Option<usize> {
        match self.epilogue {
            LtEpilogue::Bias(b) | LtEpilogue::Act { bias: Some(b), .. } => Some(b),
            _ => None,
        }
    }
}

/// A contraction kernel as one `cublasLtMatmul` (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LtProduct {
    /// The operands' dtype.
    pub dtype: DType,
    /// cuBLASLt's `m, n, k`: our N, M, K.
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub batch: i32,
    /// cuBLASLt's A (our right operand) and B (our left one).
    pub a: LtOperand,
    pub b: LtOperand,
    /// The output cuBLASLt writes itself, when the body only stores the product or
    /// `epilogue` is the whole body: its index and dtype. `None`: the product goes to an
    /// f32 buffer the body reads.
    pub direct: Option<(usize, DType)>,
    /// cuBLASLt's own epilogue, when the body is one.
    pub epilogue: LtEpilogue,
}

/// The epilogues cuBLASLt applies itself (in f32, rounded once to D's dtype).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LtEpilogue {
    /// The product alone.
    None,
    /// `relu` or `gelu` (tanh form) of the product, after a bias (one value per output
    /// column, the kernel's input `bias`) where there is one.
    Act { gelu: bool, bias: Option<usize> },
    /// The product plus a bias.
    Bias(usize),
}

/// The cuBLASLt call of contraction kernel `k`, when it has one.
pub(crate) fn plan(k: &Kernel) -> Option<LtProduct> {
    let c = k.contraction.as_ref()?;
    let dtype = k.inputs[c.lhs].dtype;
    if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
        || k.inputs[c.rhs].dtype != dtype
        || c.dtype != DType::F32
        || !c.lhs_prologue.is_empty()
        || !c.rhs_prologue.is_empty()
    {
        return None;
    }
    let (batch, m, n, kk) = c.extents();
    if batch == 0 || m == 0 || n == 0 || kk == 0 || batch > i32::MAX as usize {
        return None;
    }
    // cuBLASLt's A: our right operand [K, N] read as the column-major N x K matrix B^T;
    // its B: our left operand [M, K] read as the column-major K x M matrix A^T.
    let a = operand(c.rhs, &c.rhs_view, n, kk)?;
    let b = operand(c.lhs, &c.lhs_view, kk, m)?;
    let (direct, epilogue) = match lt_body(k, c.product, dtype) {
        Some((d, e)) => (Some(d), e),
        None => (None, LtEpilogue::None),
    };
    Some(LtProduct {
        dtype,
        m: n as u64,
        n: m as u64,
        k: kk as u64,
        batch: batch as i32,
        a,
        b,
        direct,
        epilogue,
    })
}

/// What the CUDA backend does with contraction kernel `k` on a GPU where cuBLASLt
/// loads: `None` when the emitted GEMM runs it, else one line naming the call
/// (`cublasLtMatmul bf16 -> bf16: m 4096, n 4096, k 1024, batch 1; A: N, ld 4096; B: N,
/// ld 1024; D written directly`), in cuBLASLt's column-major terms.
pub fn cublaslt_call(k: &Kernel) -> Option<String> {
    let p = plan(k)?;
    let op = |o: &LtOperand| {
        format!(
            "{}, ld {}{}",
            if o.trans { "T" } else { "N" },
            o.ld,
            if p.batch > 1 {
                format!(", batch stride {}", o.batch_stride)
            } else {
                String::new()
            }
        )
    };
    let fused = match p.epilogue {
        LtEpilogue::None => String::new(),
        LtEpilogue::Bias(b) => format!(", epilogue BIAS (in{b})"),
        LtEpilogue::Act { gelu, bias } => format!(
            ", epilogue {}{}",
            if gelu { "GELU" } else { "RELU" },
            bias.map_or(String::new(), |b| format!("_BIAS (in{b})"))
        ),
    };
    let (out, epilogue) = match p.direct {
        Some((_, d)) => (d, format!("D written directly{fused}")),
        None => (
            DType::F32,
            "the epilogue as an element-wise kernel over D".to_string(),
        ),
    };
    Some(format!(
        "cublasLtMatmul {} -> {out}: m {}, n {}, k {}, batch {}; A: {}; B: {}; {epilogue}",
        p.dtype,
        p.m,
        p.n,
        p.k,
        p.batch,
        op(&p.a),
        op(&p.b)
    ))
}

/// The element-wise kernel that runs `k`'s body over a product cuBLASLt wrote to an f32
/// buffer (the kernel's last input), when `k` goes to cuBLASLt without writing its
/// output directly.
pub fn cublaslt_epilogue(k: &Kernel) -> Option<Kernel> {
    plan(k)?.direct.is_none().then(|| epilogue_kernel(k))
}

/// `k`'s body as an element-wise kernel: the product, `k`'s last input, a buffer.
pub(crate) fn epilogue_kernel(k: &Kernel) -> Kernel {
    let mut e = k.clone();
    e.contraction = None;
    e
}

/// An operand view of shape `[batch..., X, Y]` as the column-major `rows x cols` matrix
/// `rows = Y`, `cols = X` (its transpose), with one batch stride.
fn operand(input: usize, view: &View, rows: usize, cols: usize) -> Option<LtOperand> {
    let dims = view.shape.dims();
    let r = dims.len();
    let (sx, sy) = (view.strides[r - 2], view.strides[r - 1]);
    // Column-major rows x cols: element (i, j) at i + j * ld, i along Y, j along X.
    let (trans, ld) = if sy == 1 && (sx >= rows as isize || cols == 1) {
        (false, sx.max(rows as isize))
    } else if sx == 1 && (sy >= cols as isize || rows == 1) {
        // Stored as the column-major cols x rows matrix: transposed by the op.
        (true, sy.max(cols as isize))
    } else {
        return None;
    };
    if view.offset < 0 || ld <= 0 {
        return None;
    }
    let batch_stride = batch_stride(&dims[..r - 2], &view.strides[..r - 2])?;
    Some(LtOperand {
        input,
        offset: view.offset as usize,
        trans,
        rows: rows as u64,
        cols: cols as u64,
        ld: ld as i64,
        batch_stride,
    })
}

/// The one stride of the flattened batch axes: each axis's stride is the next one's
/// times its extent (axes of extent 1 do not count), or every stride is 0.
fn batch_stride(dims: &[usize], strides: &[isize]) -> Option<i64> {
    let axes: Vec<(usize, isize)> = dims
        .iter()
        .zip(strides)
        .filter(|(&d, _)| d != 1)
        .map(|(&d, &s)| (d, s))
        .collect();
    let Some(&(_, last)) = axes.last() else {
        return Some(0);
    };
    if last < 0 {
        return None;
    }
    let mut want = last;
    for &(d, s) in axes.iter().rev() {
        if s != want {
            return None;
        }
        want = s * d as isize;
    }
    Some(last as i64)
}

/// Whether matrix products may go to cuBLASLt here: the library loads, and
/// `NDFUSE_CUDA_GEMM` is not `emitted`.
pub(crate) fn available() -> bool {
    if std::env::var("NDFUSE_CUDA_GEMM").is_ok_and(|v| v == "emitted") {
        return false;
    }
    // SAFETY: loading the library runs its initialisers, which have no preconditions;
    // cudarc only tries the names it lists.
    unsafe { sys::is_culib_present() }
}

/// The output cuBLASLt writes itself, and its epilogue, when the kernel's one store is
/// all that cuBLASLt does: the product `P` (in f32, or in the operands' dtype: the one
/// rounding of the f32 sum that cuBLASLt gives writing D in that dtype), or
/// `act(P + bias)`, `act(P)` or `P + bias` in the operands' dtype (`P` cast to that
/// dtype first when it is a half type), `bias` a load of one value per output column (offset 0,
/// stride 1 along N, 0 elsewhere) of the operands' dtype, `act` relu or gelu as
/// `Tensor::gelu` builds it (`x * sigmoid((x + x * square(x) * 0.044715) * 1.5957691)`,
/// its constants as the dtype holds them). cuBLASLt computes it in f32 with its own
/// constants and rounds once: the graph's half steps round each value to the half type
/// and hold gelu's constants rounded (1.59375 in bf16), a difference well under the
/// result's own rounding.
fn lt_body(k: &Kernel, product: usize, dtype: DType) -> Option<((usize, DType), LtEpilogue)> {
    use ndfuse_ir::{BinaryOp, UnaryOp};
    let [store] = k.stores.as_slice() else {
        return None;
    };
    let body = &k.body;
    let expr = |v: usize| &body[v].expr;
    let out = store.value.index();
    let out_dtype = k.outputs[store.output].dtype;
    if k.outputs.len() != 1 {
        return None;
    }
    // The f32 product itself, whatever the operands' dtype.
    if out_dtype == DType::F32 && matches!(expr(out), Expr::Load { input, .. } if *input == product)
    {
        return Some(((store.output, DType::F32), LtEpilogue::None));
    }
    if out_dtype != dtype {
        return None;
    }
    let is_product = |v: usize| match expr(v) {
        Expr::Load { input, .. } => *input == product && dtype == DType::F32,
        Expr::Cast(p) => {
            body[v].dtype == dtype
                && matches!(expr(p.index()), Expr::Load { input, .. } if *input == product)
        }
        _ => false,
    };
    let rank = k.domain.rank();
    let is_bias = |v: usize| match expr(v) {
        Expr::Load { input, view } => {
            let unit_n = view
                .strides
                .iter()
                .enumerate()
                .all(|(a, &st)| st == isize::from(a + 1 == rank));
            (unit_n
                && view.offset == 0
                && k.inputs[*input].dtype == dtype
                && body[v].dtype == dtype)
                .then_some(*input)
        }
        _ => None,
    };
    // `P + bias` (either order), or `P`: the value the activation takes.
    let pre = |v: usize| -> Option<Option<usize>> {
        if is_product(v) {
            return Some(None);
        }
        match expr(v) {
            Expr::Binary(BinaryOp::Add, a, b) => {
                let (a, b) = (a.index(), b.index());
                if is_product(a) {
                    is_bias(b).map(Some)
                } else if is_product(b) {
                    is_bias(a).map(Some)
                } else {
                    None
                }
            }
            _ => None,
        }
    };
    let constant = |v: usize, want: f64| match expr(v) {
        Expr::Const(c) => c.to_f64() == ndfuse_ir::round::round_f64(want, dtype),
        _ => false,
    };
    let mul = |v: usize| match expr(v) {
        Expr::Binary(BinaryOp::Mul, a, b) => Some((a.index(), b.index())),
        _ => None,
    };
    // One operand of `v = a * b` is the constant `want`: the other.
    let times = |v: usize, want: f64| {
        let (a, b) = mul(v)?;
        if constant(b, want) {
            Some(a)
        } else if constant(a, want) {
            Some(b)
        } else {
            None
        }
    };
    let other = |a: usize, b: usize, x: usize| {
        if a == x {
            Some(b)
        } else if b == x {
            Some(a)
        } else {
            None
        }
    };
    // gelu(x) = x * sigmoid((x + x * square(x) * c1) * c2): `x` when `v` is one.
    let gelu_of = |v: usize| -> Option<usize> {
        let (a, b) = mul(v)?;
        let (x, sig) = match (expr(a), expr(b)) {
            (_, Expr::Unary(UnaryOp::Sigmoid, u)) => (a, u.index()),
            (Expr::Unary(UnaryOp::Sigmoid, u), _) => (b, u.index()),
            _ => return None,
        };
        let inner = times(sig, 2.0 * (2.0 / std::f64::consts::PI).sqrt())?;
        let Expr::Binary(BinaryOp::Add, p, q) = expr(inner) else {
            return None;
        };
        let cube = times(other(p.index(), q.index(), x)?, 0.044715)?;
        let (m, n) = mul(cube)?;
        let sq = other(m, n, x)?;
        matches!(expr(sq), Expr::Unary(UnaryOp::Square, s) if s.index() == x).then_some(x)
    };
    let epilogue = if is_product(out) {
        LtEpilogue::None
    } else if let Some(x) = gelu_of(out) {
        LtEpilogue::Act {
            gelu: true,
            bias: pre(x)?,
        }
    } else if let Expr::Unary(UnaryOp::Relu, x) = expr(out) {
        LtEpilogue::Act {
            gelu: false,
            bias: pre(x.index())?,
        }
    } else {
        LtEpilogue::Bias(pre(out)??)
    };
    Some(((store.output, dtype), epilogue))
}

fn cuda_type(d: DType) -> sys::cudaDataType {
    match d {
        DType::F16 => sys::cudaDataType_t::CUDA_R_16F,
        DType::BF16 => sys::cudaDataType_t::CUDA_R_16BF,
        _ => sys::cudaDataType_t::CUDA_R_32F,
    }
}

fn lt_err(call: &str, e: lt::CublasError) -> RuntimeError {
    RuntimeError::Cuda(format!("{call}: {e:?}"))
}

/// A cuBLASLt handle and its workspace, for one device.
#[derive(Debug)]
pub(crate) struct Lt {
    handle: sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
}

// SAFETY: a cuBLASLt handle may be used from any thread (NVIDIA's docs: the handle is
// thread safe for cublasLtMatmul); the runtime calls it under its device's stream, one
// evaluation at a time per stream.
unsafe impl Send for Lt {}
// SAFETY: as for Send; `Lt` has no interior mutability of its own.
unsafe impl Sync for Lt {}

impl Drop for Lt {
    fn drop(&mut self) {
        // SAFETY: the handle was created by `new` and is destroyed once, here.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

/// Bytes of the workspace cuBLASLt may use (NVIDIA recommends 32 MiB on Hopper).
const WORKSPACE: usize = 32 << 20;

impl Lt {
    /// A handle and workspace on `stream`'s device; `None` when libcublasLt cannot be
    /// loaded or `NDFUSE_CUDA_GEMM=emitted`.
    pub(crate) fn new(stream: &Arc<CudaStream>) -> Result<Option<Lt>, RuntimeError> {
        if !available() {
            return Ok(None);
        }
        let handle = lt::create_handle().map_err(|e| lt_err("cublasLtCreate", e))?;
        // SAFETY: an uninitialised device buffer; cuBLASLt only uses it as scratch.
        let workspace = unsafe { stream.alloc::<u8>(WORKSPACE) }
            .map_err(|e| RuntimeError::Cuda(format!("cuMemAlloc (cuBLASLt workspace): {e:?}")))?;
        Ok(Some(Lt { handle, workspace }))
    }

    /// Runs `p` on `stream`: `a_buf` and `b_buf` hold cuBLASLt's A and B (the kernel's
    /// inputs `p.a.input` and `p.b.input`), `d_ptr` receives the product in `d_type`
    /// (contiguous, `p.batch x N x M` row-major in our terms). `Ok(false)` when cuBLASLt
    /// has no algorithm for it (nothing was launched).
    ///
    /// # Safety
    /// `a_buf` and `b_buf` hold every element the operands' layouts reach from their
    /// offsets, `d_ptr` points at `batch * m * n` writable elements of `d_type`, and all
    /// three stay alive until the stream has run the call.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn matmul(
        &self,
        stream: &Arc<CudaStream>,
        p: &LtProduct,
        a_buf: &CudaSlice<u8>,
        b_buf: &CudaSlice<u8>,
        bias: Option<&CudaSlice<u8>>,
        d_ptr: u64,
        d_type: DType,
    ) -> Result<bool, RuntimeError> {
        let size = p.dtype.size_bytes() as u64;
        let (a_base, _a_sync) = a_buf.device_ptr(stream);
        let (b_base, _b_sync) = b_buf.device_ptr(stream);
        let (w, _w_sync) = self.workspace.device_ptr(stream);
        let a_ptr = a_base + p.a.offset as u64 * size;
        let b_ptr = b_base + p.b.offset as u64 * size;
        let layout = |ty: DType, rows: u64, cols: u64, ld: i64, batch_stride: i64| {
            let h = lt::create_matrix_layout(cuda_type(ty), rows, cols, ld)
                .map_err(|e| lt_err("cublasLtMatrixLayoutCreate", e))?;
            let guard = Layout(h);
            if p.batch > 1 {
                // SAFETY: `h` is a live layout; each value is the attribute's type.
                unsafe {
                    lt::set_matrix_layout_attribute(
                        h,
                        sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                        (&p.batch) as *const i32 as *const c_void,
                        std::mem::size_of::<i32>(),
                    )
                    .map_err(|e| lt_err("cublasLtMatrixLayoutSetAttribute", e))?;
                    lt::set_matrix_layout_attribute(
                        h,
                        sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                        (&batch_stride) as *const i64 as *const c_void,
                        std::mem::size_of::<i64>(),
                    )
                    .map_err(|e| lt_err("cublasLtMatrixLayoutSetAttribute", e))?;
                }
            }
            Ok::<Layout, RuntimeError>(guard)
        };
        let op = |o: &LtOperand| {
            let (rows, cols) = if o.trans {
                (o.cols, o.rows)
            } else {
                (o.rows, o.cols)
            };
            layout(p.dtype, rows, cols, o.ld, o.batch_stride)
        };
        let a_layout = op(&p.a)?;
        let b_layout = op(&p.b)?;
        let d_layout = layout(d_type, p.m, p.n, p.m as i64, (p.m * p.n) as i64)?;
        let desc = Desc(
            lt::create_matmul_desc(
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cudaDataType_t::CUDA_R_32F,
            )
            .map_err(|e| lt_err("cublasLtMatmulDescCreate", e))?,
        );
        for (attr, t) in [
            (
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                p.a.trans,
            ),
            (
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB,
                p.b.trans,
            ),
        ] {
            // cublasOperation_t, an int32: CUBLAS_OP_N = 0, CUBLAS_OP_T = 1.
            let op = i32::from(t);
            // SAFETY: a live descriptor; the value is a cublasOperation_t (int32).
            unsafe {
                lt::set_matmul_desc_attribute(
                    desc.0,
                    attr,
                    (&op) as *const i32 as *const c_void,
                    std::mem::size_of::<i32>(),
                )
            }
            .map_err(|e| lt_err("cublasLtMatmulDescSetAttribute", e))?;
        }
        let (epilogue, bias_input) = match p.epilogue {
            LtEpilogue::None => (sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT, None),
            LtEpilogue::Bias(b) => (sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS, Some(b)),
            LtEpilogue::Act { gelu, bias } => (
                match (gelu, bias.is_some()) {
                    (true, true) => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU_BIAS,
                    (true, false) => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU,
                    (false, true) => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_RELU_BIAS,
                    (false, false) => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_RELU,
                },
                bias,
            ),
        };
        // SAFETY: a live descriptor; the value is a cublasLtEpilogue_t (u32).
        unsafe {
            lt::set_matmul_desc_attribute(
                desc.0,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_EPILOGUE,
                (&epilogue) as *const sys::cublasLtEpilogue_t as *const c_void,
                std::mem::size_of::<sys::cublasLtEpilogue_t>(),
            )
        }
        .map_err(|e| lt_err("cublasLtMatmulDescSetAttribute", e))?;
        let bias_ptr = bias_input.map(|_| {
            bias.expect("a bias buffer for a bias epilogue")
                .device_ptr(stream)
        });
        if let Some((ptr, _)) = &bias_ptr {
            // SAFETY: a live descriptor; the value is a device pointer (u64).
            unsafe {
                lt::set_matmul_desc_attribute(
                    desc.0,
                    sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                    ptr as *const u64 as *const c_void,
                    std::mem::size_of::<u64>(),
                )
            }
            .map_err(|e| lt_err("cublasLtMatmulDescSetAttribute", e))?;
        }
        let pref = Pref(
            lt::create_matmul_pref().map_err(|e| lt_err("cublasLtMatmulPreferenceCreate", e))?,
        );
        // Partial sums of a split K stay f32 (the contraction's accumulator): seen on an
        // H100, a bf16 product of K = 1023 missed the f32 bound, its partials added in
        // bf16 (cuBLASLt's in-place and output-type schemes).
        let reduction =
            sys::cublasLtReductionScheme_t::CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE as u32;
        // SAFETY: a live preference; the value is the attribute's type (u32).
        unsafe {
            lt::set_matmul_pref_attribute(
                pref.0,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                (&reduction) as *const u32 as *const c_void,
                std::mem::size_of::<u32>(),
            )
        }
        .map_err(|e| lt_err("cublasLtMatmulPreferenceSetAttribute", e))?;

        // The alignment every pointer, leading dimension and batch stride keeps: the
        // heuristic otherwise assumes 16 bytes and may pick a kernel that needs them.
        let align = |ptr: u64, strides: &[i64], size: u64| -> u32 {
            let mut a = 256u64;
            for v in std::iter::once(ptr).chain(strides.iter().map(|&s| s as u64 * size)) {
                if v != 0 {
                    a = a.min(1 << v.trailing_zeros().min(8));
                }
            }
            a as u32
        };
        let d_size = d_type.size_bytes() as u64;
        let prefs: [(sys::cublasLtMatmulPreferenceAttributes_t, u32); 4] = [
            (
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                align(a_ptr, &[p.a.ld, p.a.batch_stride], size),
            ),
            (
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                align(b_ptr, &[p.b.ld, p.b.batch_stride], size),
            ),
            (
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                align(d_ptr, &[p.m as i64, (p.m * p.n) as i64], d_size),
            ),
            (
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                align(d_ptr, &[p.m as i64, (p.m * p.n) as i64], d_size),
            ),
        ];
        let workspace = WORKSPACE as u64;
        // SAFETY: a live preference; each value is the attribute's type (u64, u32).
        unsafe {
            lt::set_matmul_pref_attribute(
                pref.0,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&workspace) as *const u64 as *const c_void,
                std::mem::size_of::<u64>(),
            )
            .map_err(|e| lt_err("cublasLtMatmulPreferenceSetAttribute", e))?;
            for (attr, v) in &prefs {
                lt::set_matmul_pref_attribute(
                    pref.0,
                    *attr,
                    v as *const u32 as *const c_void,
                    std::mem::size_of::<u32>(),
                )
                .map_err(|e| lt_err("cublasLtMatmulPreferenceSetAttribute", e))?;
            }
        }
        // SAFETY: every handle is live; D's layout serves as C's (beta is 0).
        let heuristic = match unsafe {
            lt::get_matmul_algo_heuristic(
                self.handle,
                desc.0,
                a_layout.0,
                b_layout.0,
                d_layout.0,
                d_layout.0,
                pref.0,
            )
        } {
            Ok(h) => h,
            Err(lt::CublasError(sys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED)) => {
                return Ok(false)
            }
            Err(e) => return Err(lt_err("cublasLtMatmulAlgoGetHeuristic", e)),
        };
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: the caller guarantees the buffers (see the function's docs); the
        // layouts describe exactly those reaches; the workspace is WORKSPACE bytes.
        unsafe {
            lt::matmul(
                self.handle,
                desc.0,
                (&alpha) as *const f32 as *const c_void,
                (&beta) as *const f32 as *const c_void,
                a_ptr as *const c_void,
                a_layout.0,
                b_ptr as *const c_void,
                b_layout.0,
                d_ptr as *const c_void,
                d_layout.0,
                d_ptr as *mut c_void,
                d_layout.0,
                &heuristic.algo,
                w as *mut c_void,
                WORKSPACE,
                stream.cu_stream() as sys::cudaStream_t,
            )
        }
        .map_err(|e| lt_err("cublasLtMatmul", e))?;
        Ok(true)
    }
}

/// Owners of cuBLASLt descriptors, destroyed on drop.
struct Layout(sys::cublasLtMatrixLayout_t);
struct Desc(sys::cublasLtMatmulDesc_t);
struct Pref(sys::cublasLtMatmulPreference_t);

impl Drop for Layout {
    fn drop(&mut self) {
        // SAFETY: created by cublasLtMatrixLayoutCreate, destroyed once, here.
        let _ = unsafe { lt::destroy_matrix_layout(self.0) };
    }
}
impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: created by cublasLtMatmulDescCreate, destroyed once, here.
        let _ = unsafe { lt::destroy_matmul_desc(self.0) };
    }
}
impl Drop for Pref {
    fn drop(&mut self) {
        // SAFETY: created by cublasLtMatmulPreferenceCreate, destroyed once, here.
        let _ = unsafe { lt::destroy_matmul_pref(self.0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndfuse_ir::Shape;

    fn view(dims: &[usize], strides: &[isize], offset: isize) -> View {
        View {
            shape: Shape::new(dims.to_vec()),
            strides: strides.to_vec(),
            offset,
        }
    }

    #[test]
    fn batch_axes_collapse_to_one_stride_or_none() {
        // Contiguous batch axes: the innermost batch stride.
        assert_eq!(batch_stride(&[2, 3], &[3 * 40, 40]), Some(40));
        // Broadcast everywhere: 0.
        assert_eq!(batch_stride(&[2, 3], &[0, 0]), Some(0));
        // Axes of extent 1 do not count; no batch at all is stride 0.
        assert_eq!(batch_stride(&[1, 5, 1], &[7, 40, 9]), Some(40));
        assert_eq!(batch_stride(&[], &[]), Some(0));
        // Broadcast on one axis only, a gap, or a reversed batch: no single stride.
        assert_eq!(batch_stride(&[2, 3], &[120, 0]), None);
        assert_eq!(batch_stride(&[2, 3], &[200, 40]), None);
        assert_eq!(batch_stride(&[4], &[-40]), None);
    }

    #[test]
    fn an_operand_is_read_as_stored_or_transposed_never_copied() {
        // [K=32, N=48] row-major, read as the column-major N x K matrix: no transpose.
        let o = operand(1, &view(&[32, 48], &[48, 1], 0), 48, 32).expect("row-major");
        assert_eq!((o.trans, o.ld, o.rows, o.cols), (false, 48, 48, 32));
        // Its transpose view (unit stride on K): stored K x N, transposed by the op.
        let o = operand(1, &view(&[32, 48], &[1, 32], 0), 48, 32).expect("col-major");
        assert_eq!((o.trans, o.ld), (true, 32));
        // A row slice keeps its leading dimension and carries its offset.
        let o = operand(0, &view(&[64, 32], &[40, 1], 120), 32, 64).expect("a slice");
        assert_eq!((o.trans, o.ld, o.offset), (false, 40, 120));
        // A vector operand (one column): any stride of the other axis.
        let o = operand(0, &view(&[1, 32], &[0, 1], 0), 32, 1).expect("a vector");
        assert_eq!((o.trans, o.ld), (false, 32));
        // No unit stride, a negative one, or a leading dimension shorter than a column.
        assert!(operand(0, &view(&[64, 32], &[64, 2], 0), 32, 64).is_none());
        assert!(operand(0, &view(&[64, 32], &[-32, 1], 2016), 32, 64).is_none());
        assert!(operand(0, &view(&[64, 32], &[16, 1], 0), 32, 64).is_none());
    }
}
