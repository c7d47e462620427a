//! The emitted CUDA C *run*, without a GPU: each kernel of the fusion catalogue and of
//! the strategy graphs is compiled with the host's C++ compiler against a small CUDA
//! emulator (`tests/cuda_emu/cuda_emu.h`: a block's threads are OS threads, so barriers,
//! warp shuffles and shared memory behave as on a GPU) and its outputs are compared with
//! the reference interpreter's evaluation of the same kernel description
//! (`ndfuse_ir::interp::eval_kernel`) on random inputs.
//!
//! This checks what the snapshots and NVRTC cannot: indexing, the row programs' sweeps,
//! the tree combines, split reductions through scratch memory, grid-stride loops (grids
//! are capped at a few blocks here so that every loop takes several turns), the half
//! conversions, and the tensor-core GEMM's staging, fragment layouts and warp
//! synchronisation (`tests/cuda_emu/mma.h` emulates the `nvcuda::wmma` it uses). It says nothing about speed, and the math functions are the host's
//! (glibc), not CUDA's; `cuda_exec.rs` covers those on a real GPU.
//!
//! Needs a C++20 compiler (`$CXX`, else `g++`); without one the tests print why and
//! pass.
//!
//! Tolerances: ints and bools exact; f64 1e-12; f32 2e-5 relative (sums combine in a
//! tree, the reference compensates in f64); f16 / bf16 one step of their precision
//! (values are computed in f32 and rounded once, as in the reference). Matrix products
//! (f32 accumulation, f64 for f64 operands) are held to the same tolerances; those on
//! tensor cores to a bound per element derived from K and the dtypes' epsilons
//! ([`wmma_tolerance`]).

use ndfuse::{Context, DType, Tensor};
use ndfuse_codegen_cuda::{emit, CudaKernel, CudaOptions};
use ndfuse_ir::{
    BinaryOp, Buffer, Expr, GatherAxis, HostArray, Instr, Kernel, Plan, Scalar, Shape, Storage,
    Store, ValueId, View,
};
use ndfuse_passes::TargetDesc;
use ndfuse_tests::catalogue::CATALOGUE;
use std::alloc::Layout;
use std::path::{Path, PathBuf};
use std::process::Command;

fn compiler() -> Option<String> {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    let ok = Command::new(&cxx)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    ok.then_some(cxx)
}

fn emu_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda_emu")
}

/// A zeroed, 64-byte aligned byte buffer (wide vector loads need their alignment).
struct Aligned {
    ptr: *mut u8,
    layout: Layout,
}

impl Aligned {
    fn new(bytes: usize, fill: u8) -> Aligned {
        let layout = Layout::from_size_align(bytes.max(64), 64).expect("valid layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc(layout) };
        assert!(!ptr.is_null(), "allocation failed");
        // SAFETY: `ptr` is valid for `layout.size()` bytes.
        unsafe { std::ptr::write_bytes(ptr, fill, layout.size()) };
        Aligned { ptr, layout }
    }

    fn bytes(&self, n: usize) -> &[u8] {
        assert!(n <= self.layout.size());
        // SAFETY: `ptr` is valid and initialised for `layout.size()` bytes.
        unsafe { std::slice::from_raw_parts(self.ptr, n) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `new`.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

/// Random data for a buffer: floats normal around 0.5, ints in -1000..1000, bools.
fn random_input(dtype: DType, len: usize, seed: u64) -> HostArray {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let shape = Shape::new([len]);
    match dtype {
        DType::I32 | DType::I64 => {
            let v: Vec<i64> = (0..len).map(|_| (next() % 2001) as i64 - 1000).collect();
            HostArray::new(shape, Storage::from_i64s(dtype, &v)).expect("length matches")
        }
        DType::Bool => {
            let v: Vec<bool> = (0..len).map(|_| next() % 2 == 0).collect();
            HostArray::new(shape, Storage::Bool(v)).expect("length matches")
        }
        _ => {
            let v: Vec<f64> = (0..len)
                .map(|_| {
                    let u = (next() >> 11) as f64 / (1u64 << 53) as f64;
                    let w = (next() >> 11) as f64 / (1u64 << 53) as f64;
                    0.5 + 2.0
                        * (-2.0 * (u.max(1e-300)).ln()).sqrt()
                        * (std::f64::consts::TAU * w).cos()
                })
                .collect();
            HostArray::from_f64s(dtype, shape, &v)
        }
    }
}

/// A host array of `dtype` from the bytes a kernel wrote; `Err` for a bool byte that is
/// neither 0 nor 1 (an element the kernel never wrote).
fn from_bytes(dtype: DType, len: usize, bytes: &[u8]) -> Result<HostArray, String> {
    if dtype == DType::Bool {
        let v: Result<Vec<bool>, String> = bytes[..len]
            .iter()
            .enumerate()
            .map(|(i, &b)| match b {
                0 => Ok(false),
                1 => Ok(true),
                _ => Err(format!("bool element {i} is byte {b:#x}: never written")),
            })
            .collect();
        return Ok(HostArray::new(Shape::new([len]), Storage::Bool(v?)).expect("length matches"));
    }
    let mut st = Storage::zeros(dtype, len);
    let n = len * dtype.size_bytes();
    // SAFETY: `st` holds `len` elements of `dtype`, `n` bytes at `as_mut_ptr`; every bit
    // pattern is a valid f16/bf16/f32/f64/i32/i64.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), st.as_mut_ptr(), n) };
    Ok(HostArray::new(Shape::new([len]), st).expect("length matches"))
}

fn tolerance(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F64 => (1e-12, 1e-12),
        DType::F32 => (2e-5, 2e-5),
        DType::F16 => (2e-3, 2e-3),
        DType::BF16 => (1.6e-2, 1.6e-2),
        _ => (0.0, 0.0),
    }
}

type Launch = unsafe extern "C" fn(*const (), u32, u32, u32, i32, *const *mut u8) -> i32;

/// Builds every kernel of `cks` into one library: each source in its own namespace
/// with its functions renamed `b{i}_...`, so that one compiler run serves them all.
fn build(cxx: &str, dir: &Path, cks: &[&CudaKernel]) -> libloading::Library {
    // A fresh name per build: a library once loaded may stay mapped (it has
    // thread-locals), so a path is never reused.
    static BUILDS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let src = dir.join(format!("batch-{n}.cu"));
    let so = dir.join(format!("batch-{n}.so"));
    let mut tu = String::new();
    for (i, ck) in cks.iter().enumerate() {
        let body: String = ck
            .source
            .lines()
            .filter(|l| !l.starts_with("#include"))
            .map(|l| format!("{l}\n"))
            .collect();
        tu.push_str(&format!(
            "namespace nd_b{i} {{\n{}}}\n",
            body.replace(&ck.name, &format!("b{i}_{}", ck.name))
        ));
    }
    std::fs::write(&src, &tu).expect("write source");
    let emu = emu_dir();
    let out = Command::new(cxx)
        .args([
            "-std=c++20",
            "-O1",
            "-shared",
            "-fPIC",
            "-pthread",
            "-w",
            "-x",
            "c++",
        ])
        .arg("-I")
        .arg(&emu)
        .arg("-include")
        .arg(emu.join("cuda_emu.h"))
        .arg("-include")
        .arg(emu.join("mma.h"))
        .arg(&src)
        .arg("-o")
        .arg(&so)
        .output()
        .expect("run the C++ compiler");
    assert!(
        out.status.success(),
        "the emulator build failed:\n{}\n{tu}",
        String::from_utf8_lossy(&out.stderr)
    );
    // SAFETY: the library was just built from the emulator and emitted sources; loading
    // it runs no initialisers beyond C++ statics.
    unsafe { libloading::Library::new(&so) }.expect("load the emulated kernels")
}

/// Runs kernel `i` of a [`build`] on `inputs` and returns its outputs.
fn run_emulated(
    lib: &libloading::Library,
    i: usize,
    kernel: &Kernel,
    ck: &CudaKernel,
    inputs: &[HostArray],
) -> Vec<HostArray> {
    let mut bufs: Vec<Aligned> = Vec::new();
    for a in inputs {
        let n = a.len() * a.dtype().size_bytes();
        let b = Aligned::new(n, 0);
        // SAFETY: `b` holds at least `n` bytes; the storage holds exactly `n` bytes.
        unsafe { std::ptr::copy_nonoverlapping(a.storage().as_ptr(), b.ptr, n) };
        bufs.push(b);
    }
    // Outputs and scratch start as 0xff bytes: NaN floats, -1 ints, invalid bools, so an
    // element a kernel forgets to write shows.
    for o in &kernel.outputs {
        bufs.push(Aligned::new(o.len * o.dtype.size_bytes(), 0xff));
    }
    if ck.scratch_bytes > 0 {
        bufs.push(Aligned::new(ck.scratch_bytes, 0xff));
    }
    let args: Vec<*mut u8> = bufs.iter().map(|b| b.ptr).collect();
    // SAFETY: `nd_emu_launch` is defined by cuda_emu.h with exactly this signature.
    let launch: libloading::Symbol<Launch> =
        unsafe { lib.get(b"nd_emu_launch\0") }.expect("nd_emu_launch");
    for l in &ck.launches {
        let name = format!("b{i}_{}\0", l.function);
        // SAFETY: every emitted function takes only pointer parameters; it is called
        // through `nd_emu_launch` with one pointer per parameter.
        let f: libloading::Symbol<*const ()> =
            unsafe { lib.get(name.as_bytes()) }.expect("kernel function");
        // SAFETY: `args` holds one live, 64-byte aligned buffer per parameter (inputs,
        // outputs, scratch), each at least as large as the kernel description says.
        let rc = unsafe {
            launch(
                *f,
                l.grid,
                l.block.0,
                l.block.1,
                args.len() as i32,
                args.as_ptr(),
            )
        };
        assert_eq!(rc, 0, "{}: bad launch shape", l.function);
    }
    let first_out = inputs.len();
    kernel
        .outputs
        .iter()
        .enumerate()
        .map(|(o_i, o)| {
            let bytes = bufs[first_out + o_i].bytes(o.len * o.dtype.size_bytes());
            from_bytes(o.dtype, o.len, bytes)
                .unwrap_or_else(|e| panic!("{} output {o_i}: {e}\n{}", ck.name, ck.source))
        })
        .collect()
}

/// How far an emulated element may be from the reference: given the kernel, its inputs,
/// the output's dtype, the element's index and the reference value, the largest
/// difference allowed.
type Tolerance = dyn Fn(&Kernel, &[HostArray], DType, usize, f64) -> f64;

/// Emits, builds (in one library) and runs every `(kernel, options, label)`, comparing
/// each with the reference within [`tolerance`].
fn check_kernels(cxx: &str, dir: &Path, items: &[(Kernel, CudaOptions, String)]) {
    check_kernels_within(cxx, dir, items, &|_, _, dtype, _, want| {
        let (rtol, atol) = tolerance(dtype);
        atol + rtol * want.abs()
    });
}

/// [`check_kernels`] with the tolerance `tol`.
fn check_kernels_within(
    cxx: &str,
    dir: &Path,
    items: &[(Kernel, CudaOptions, String)],
    tol: &Tolerance,
) {
    check_kernels_on(cxx, dir, items, tol, &|j, b| {
        random_input(b.dtype, b.len, 1 + j as u64)
    });
}

/// [`check_kernels_within`] on inputs from `input` (given each bound input's number
/// and buffer).
fn check_kernels_on(
    cxx: &str,
    dir: &Path,
    items: &[(Kernel, CudaOptions, String)],
    tol: &Tolerance,
    input: &dyn Fn(usize, &Buffer) -> HostArray,
) {
    let cks: Vec<CudaKernel> = items
        .iter()
        .map(|(k, o, what)| emit(k, o).unwrap_or_else(|e| panic!("{what}: {e}")))
        .collect();
    let lib = build(cxx, dir, &cks.iter().collect::<Vec<_>>());
    for (i, ((kernel, _, what), ck)) in items.iter().zip(&cks).enumerate() {
        // A contraction's product (the last input) is not bound: it never exists.
        let bound = kernel.inputs.len() - usize::from(kernel.contraction.is_some());
        let inputs: Vec<HostArray> = kernel.inputs[..bound]
            .iter()
            .enumerate()
            .map(|(j, b)| input(j, b))
            .collect();
        let refs: Vec<&HostArray> = inputs.iter().collect();
        let want =
            ndfuse_ir::interp::eval_kernel(kernel, &refs).unwrap_or_else(|e| panic!("{what}: {e}"));
        let got = run_emulated(&lib, i, kernel, ck, &inputs);
        for (o, (g, w)) in got.iter().zip(&want).enumerate() {
            let (gv, wv) = (g.to_f64s(), w.to_f64s());
            assert_eq!(gv.len(), wv.len(), "{what}: output {o} length");
            for (e, (a, b)) in gv.iter().zip(&wv).enumerate() {
                let bound = tol(kernel, &inputs, g.dtype(), e, *b);
                let ok = (a.is_nan() && b.is_nan())
                    || a == b
                    || (a.is_finite() && b.is_finite() && (a - b).abs() <= bound);
                assert!(
                    ok,
                    "{what}: {} output {o} element {e}: emulated CUDA {a:e}, reference {b:e}, allowed {bound:e}\n{}",
                    ck.name, ck.source
                );
            }
        }
    }
}

fn kernels_of(ctx: &Context, outs: &[Tensor]) -> Vec<Kernel> {
    let refs: Vec<&Tensor> = outs.iter().collect();
    let g = ctx.graph(&refs).expect("builds");
    ndfuse_passes::schedule_for(&g, &TargetDesc::cuda())
        .kernels()
        .cloned()
        .collect()
}

fn scratch_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ndfuse-cuda-emu-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// Grids capped at a few blocks, so every grid-stride loop takes several turns.
const SMALL_GRID: CudaOptions = CudaOptions {
    max_block_size: 256,
    max_grid_size: 7,
    compute_capability: None,
};

#[test]
fn every_catalogue_kernel_computes_what_the_reference_does() {
    let Some(cxx) = compiler() else {
        eprintln!("skipped: no C++ compiler ($CXX or g++) to build the CUDA emulator");
        return;
    };
    let dir = scratch_dir("catalogue");
    let mut items = Vec::new();
    for case in CATALOGUE {
        let ctx = Context::new();
        let outs = (case.build)(&ctx);
        for k in kernels_of(&ctx, &outs) {
            items.push((k, SMALL_GRID, case.name.to_string()));
        }
    }
    check_kernels(&cxx, &dir, &items);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_strategy_computes_what_the_reference_does() {
    let Some(cxx) = compiler() else {
        eprintln!("skipped: no C++ compiler ($CXX or g++) to build the CUDA emulator");
        return;
    };
    let dir = scratch_dir("strategies");
    let ctx = Context::new();
    let x = |shape: &[usize]| ctx.rand_normal(shape, 0.5, 2.0, shape.iter().sum::<usize>() as u64);
    let h = x(&[4096]).cast(DType::F16);
    let cases: Vec<(&str, Vec<Tensor>)> = vec![
        (
            "softmax rows of 4096 in registers",
            vec![x(&[6, 4096]).softmax(-1)],
        ),
        (
            "softmax rows of 9000, three passes",
            vec![x(&[3, 9000]).softmax(-1)],
        ),
        (
            "layernorm rows of 1024",
            vec![x(&[9, 1024]).layernorm(-1, 1e-5)],
        ),
        ("full sum, split", vec![x(&[1 << 17]).sum(0)]),
        ("full var, split in two sweeps", vec![x(&[70_000]).var(0)]),
        (
            "argmax of long rows, split",
            vec![x(&[3, 50_000]).argmax(1)],
        ),
        ("column sum, tile", vec![x(&[300, 70]).sum(0)]),
        ("middle axis sum, tile", vec![x(&[5, 64, 40]).sum(1)]),
        (
            "outer axes sum, warp",
            vec![x(&[4, 16, 33]).sum(vec![0i64, 2])],
        ),
        ("rows of 7, thread per row", vec![x(&[100, 7]).max(1)]),
        (
            "broadcast, vectorised",
            vec![&(&x(&[64, 512]) * &x(&[512])) + &x(&[64, 1])],
        ),
        ("odd sizes, scalar loop", vec![(&x(&[37, 3]) * 2.0).exp()]),
        ("f16 gelu, vectorised", vec![h.gelu()]),
        (
            "bf16 softmax",
            vec![x(&[8, 300]).cast(DType::BF16).softmax(-1)],
        ),
        (
            "int max and sum",
            vec![
                x(&[40, 100]).cast(DType::I32).max(1),
                x(&[40, 100]).cast(DType::I64).sum(0),
            ],
        ),
        ("argmin with a sibling sum", {
            let a = x(&[50, 40]);
            vec![a.argmin(1), a.sum(1)]
        }),
    ];
    let mut items = Vec::new();
    for (name, outs) in &cases {
        for opts in [
            SMALL_GRID,
            CudaOptions {
                max_block_size: 64,
                max_grid_size: 3,
                compute_capability: None,
            },
        ] {
            for k in kernels_of(&ctx, outs) {
                items.push((k, opts, format!("{name} ({opts:?})")));
            }
        }
    }
    check_kernels(&cxx, &dir, &items);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every unary op on every float dtype, and every binary op on every dtype it takes,
/// over contiguous, transposed, broadcast and reversed-slice inputs.
#[test]
fn every_op_on_every_dtype_and_layout_computes_what_the_reference_does() {
    let Some(cxx) = compiler() else {
        eprintln!("skipped: no C++ compiler ($CXX or g++) to build the CUDA emulator");
        return;
    };
    let dir = scratch_dir("ops");
    let ctx = Context::new();
    let mut items = Vec::new();
    let mut add = |what: String, outs: Vec<Tensor>| {
        for k in kernels_of(&ctx, &outs) {
            items.push((k, SMALL_GRID, what.clone()));
        }
    };
    let base = ctx.rand_normal(&[24, 36], 0.3, 2.0, 11);
    let other = ctx.rand_normal(&[36], 0.1, 1.5, 12);
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        let x = base.cast(dtype);
        let layouts = [
            ("contiguous", x.clone()),
            ("transposed", x.transpose()),
            (
                "reversed slice",
                x.slice(&[
                    ndfuse::SliceArg::new(None, None, -1),
                    ndfuse::SliceArg::new(Some(1), None, 3),
                ]),
            ),
        ];
        for (layout, v) in &layouts {
            let pos = v.abs() + 0.25;
            let unary = vec![
                v.neg(),
                v.abs(),
                v.sign(),
                v.exp(),
                pos.log(),
                pos.log1p(),
                v.expm1(),
                pos.sqrt(),
                pos.rsqrt(),
                v.square(),
                v.recip(),
                v.sin(),
                v.cos(),
                v.tanh(),
                v.sigmoid(),
                v.relu(),
                v.erf(),
                v.floor(),
                v.ceil(),
                v.round(),
            ];
            add(format!("unary ops {dtype} {layout}"), unary);
        }
        let y = other.cast(dtype);
        let binary = vec![
            &x + &y,
            &x - &y,
            &x * &y,
            &x / &y,
            (x.abs() + 0.5).pow(&y),
            x.maximum(&y),
            x.minimum(&y),
            x.eq(&y),
            x.ne(&y),
            x.lt(&y),
            x.le(&y),
            x.gt(&y),
            x.ge(&y),
            x.gt(0.0).where_(&x, &y),
        ];
        add(format!("binary ops {dtype} (broadcast)"), binary);
    }
    for dtype in [DType::I32, DType::I64] {
        let x = (&base * 1000.0).cast(dtype);
        let y = (&other * 7.0).cast(dtype);
        let ops = vec![
            &x + &y,
            &x - &y,
            &x * &y,
            x.maximum(&y),
            x.minimum(&y),
            x.abs(),
            x.neg(),
            x.sign(),
            x.square(),
            x.relu(),
            x.eq(&y),
            x.lt(&y),
            x.ge(&y),
            x.transpose().cast(DType::F32),
            x.cast(DType::F16),
            x.cast(DType::BF16),
            (x.cast(DType::F64) * 1e12).cast(dtype),
        ];
        add(format!("integer ops {dtype}"), ops);
    }
    let b = base.gt(0.5);
    let c = other.lt(0.0);
    add(
        "bool ops".into(),
        vec![
            b.and(&c),
            b.or(&c),
            b.logical_not(),
            b.cast(DType::F32),
            b.cast(DType::I64),
        ],
    );
    check_kernels(&cxx, &dir, &items);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Matrix products through the tiled GEMM (`emit/gemm.rs`): extents that are not
/// multiples of any tile (7 x 65 x 33), several tiles on M and N with grids smaller than
/// the tile count, a batch of 3 broadcast from either side, a transposed operand, K = 0,
/// every dtype, and fused epilogues, against the reference's f64 product.
#[test]
fn every_gemm_computes_what_the_reference_does() {
    let Some(cxx) = compiler() else {
        eprintln!("skipped: no C++ compiler ($CXX or g++) to build the CUDA emulator");
        return;
    };
    let dir = scratch_dir("gemm");
    let ctx = Context::new();
    let x = |shape: &[usize]| ctx.rand_normal(shape, 0.5, 2.0, shape.iter().sum::<usize>() as u64);
    let cases: Vec<(String, Vec<Tensor>)> = {
        let mut v: Vec<(String, Vec<Tensor>)> = vec![
            (
                "f32 7x65x33".into(),
                vec![x(&[7, 65]).matmul(&x(&[65, 33]))],
            ),
            (
                "f32 gelu(x @ w + b) + r, 7x65x33".into(),
                vec![&(&x(&[7, 65]).matmul(&x(&[65, 33])) + &x(&[33])).gelu() + &x(&[7, 33])],
            ),
            (
                "f32 130x40x70, several tiles".into(),
                vec![x(&[130, 40]).matmul(&x(&[40, 70])).relu()],
            ),
            (
                "f32 batch of 3, rhs broadcast".into(),
                vec![x(&[3, 7, 65]).matmul(&x(&[65, 33]))],
            ),
            (
                "f32 batch of 3, lhs broadcast, rhs transposed".into(),
                vec![x(&[7, 65]).matmul(&x(&[3, 33, 65]).permute(&[0, 2, 1]))],
            ),
            (
                "f32 batch 2x3 broadcast both ways, lhs transposed".into(),
                vec![x(&[2, 1, 65, 7])
                    .permute(&[0, 1, 3, 2])
                    .matmul(&x(&[3, 65, 33]))],
            ),
            (
                "f32 K = 0".into(),
                vec![&ctx.zeros(&[5, 0]).matmul(&ctx.zeros(&[0, 6])) + 1.5],
            ),
            (
                "f32 prologues (x * 0.125) @ (w.T / 3), 7x65x33".into(),
                vec![(&x(&[7, 65]) * 0.125).matmul(&(&x(&[33, 65]).transpose() / 3.0))],
            ),
            (
                "f32 operands rounded to bf16 for a bf16 product, 7x65x33".into(),
                vec![x(&[7, 65])
                    .cast(DType::BF16)
                    .matmul(&x(&[65, 33]).cast(DType::BF16))],
            ),
        ];
        for dtype in [DType::F16, DType::BF16, DType::F64, DType::I32, DType::I64] {
            let scale = if dtype.is_float() { 1.0 } else { 100.0 };
            let a = (x(&[3, 7, 65]) * scale).cast(dtype);
            let w = (x(&[33, 65]) * scale).cast(dtype);
            v.push((
                format!("{dtype} batch of 3, rhs broadcast and transposed"),
                vec![a.matmul(&w.transpose())],
            ));
        }
        v
    };
    // 256 threads are 16 x 16, 128 are 8 x 16 and 32 are 4 x 8: thread grids that are
    // not square catch a row index taken for a column one.
    let options = [
        SMALL_GRID,
        CudaOptions {
            max_block_size: 128,
            max_grid_size: 5,
            compute_capability: None,
        },
        CudaOptions {
            max_block_size: 32,
            max_grid_size: 3,
            compute_capability: None,
        },
    ];
    let mut items = Vec::new();
    for (name, outs) in &cases {
        for opts in options {
            for k in kernels_of(&ctx, outs) {
                items.push((k, opts, format!("{name} ({opts:?})")));
            }
        }
    }
    assert!(
        items
            .iter()
            .filter(|(k, _, _)| k.contraction.is_some())
            .count()
            >= options.len() * cases.len(),
        "every case has a contraction kernel"
    );
    check_kernels(&cxx, &dir, &items);
    let _ = std::fs::remove_dir_all(&dir);
}

/// At element `e` of a contraction kernel's domain (every output is laid out as the
/// domain): the exact product `P` and `S = sum over k of |a_k * b_k|`, in f64 from the
/// operand buffers read through the contraction's views.
fn product_and_magnitude(kernel: &Kernel, inputs: &[HostArray], e: usize) -> (f64, f64) {
    let c = kernel.contraction.as_ref().expect("a contraction kernel");
    let (_, _, _, kk) = c.extents();
    let dims = kernel.domain.dims();
    let rank = dims.len();
    let mut index = vec![0usize; rank];
    let mut rest = e;
    for a in (0..rank).rev() {
        index[a] = rest % dims[a];
        rest /= dims[a];
    }
    let (lhs, rhs) = (inputs[c.lhs].to_f64s(), inputs[c.rhs].to_f64s());
    let (lv, rv) = (&c.lhs_view, &c.rhs_view);
    let base = |view: &ndfuse_ir::View, fixed: usize, at: usize| {
        let batch: isize = (view.strides[..rank - 2].iter())
            .zip(&index)
            .map(|(&stride, &i)| stride * i as isize)
            .sum();
        view.offset + batch + view.strides[fixed] * at as isize
    };
    let (la, rb) = (
        base(lv, rank - 2, index[rank - 2]),
        base(rv, rank - 1, index[rank - 1]),
    );
    let (mut p, mut s) = (0.0, 0.0);
    for k in 0..kk as isize {
        let x = lhs[(la + lv.strides[rank - 1] * k) as usize];
        let y = rhs[(rb + rv.strides[rank - 2] * k) as usize];
        p += x * y;
        s += (x * y).abs();
    }
    (p, s)
}

/// Tolerance of the tensor-core GEMM against the reference, from K and the epsilons of
/// f32 (`u32 = 2^-24`, the accumulators) and of the operands' half type (`u`: 2^-11 for
/// f16, 2^-8 for bf16; `u_out` the same for the output's dtype):
/// - the f32 sum of the K exact products (half values multiply exactly in f32), in any
///   order, is within `K * u32 * S` of the exact sum, and the reference's own rounding
///   of it to f32 adds `u32 * S` at most: `(K + 1) * u32 * S`;
/// - each rounding to the half type inside the epilogue (the product's, the bias sum's)
///   may land one ulp (`2u` relative) away when its input moved: `2u * |P|` and
///   `2u * (|P| + B)`, `B` the largest other input (the bias);
/// - both carried through at most gelu's steepest slope (1.13, a bound for every
///   epilogue here: relu and the identity have 1);
/// - the output's own rounding, one ulp: `2 * u_out * |want|`, plus f16's smallest
///   subnormal (2^-24) where the output is f16.
fn wmma_tolerance(kernel: &Kernel, inputs: &[HostArray], out: DType, e: usize, want: f64) -> f64 {
    let c = kernel.contraction.as_ref().expect("a contraction kernel");
    let (_, _, _, kk) = c.extents();
    let unit = |d: DType| match d {
        DType::F16 => 2f64.powi(-11),
        DType::BF16 => 2f64.powi(-8),
        _ => 2f64.powi(-24),
    };
    let u = unit(kernel.inputs[c.lhs].dtype);
    let u32 = 2f64.powi(-24);
    let others = (0..inputs.len())
        .filter(|&i| i != c.lhs && i != c.rhs)
        .flat_map(|i| inputs[i].to_f64s())
        .fold(0.0f64, |m, x| m.max(x.abs()));
    let (p, s) = product_and_magnitude(kernel, inputs, e);
    let subnormal = if out == DType::F16 {
        2f64.powi(-24)
    } else {
        0.0
    };
    1.13 * ((kk as f64 + 1.0) * u32 * s + 2.0 * u * p.abs() + 2.0 * u * (p.abs() + others))
        + 2.0 * unit(out) * want.abs()
        + subnormal
}

/// Matrix products of f16 and bf16 operands on tensor cores (`emit/gemm_wmma.rs`, as
/// emitted for an sm_80 device), through the emulator's `nvcuda::wmma` (`cuda_emu/mma.h`):
/// sizes 1, 7, 16, 17 and 65 on each of M, N and K (65 is more than the K slice of 32)
/// and K = 0,
/// several tiles with grids smaller than the tile count, transposed operands (col-major
/// fragments), inner axes staged element by element and in 16-byte copies, batches
/// broadcast from either side, and epilogues (bias + gelu, relu, casts to f32 and to the
/// other half type), with 8, 2 and 1 warps per block, against the reference's f64
/// product within [`wmma_tolerance`].
#[test]
fn every_wmma_gemm_computes_what_the_reference_does() {
    let Some(cxx) = compiler() else {
        eprintln!("skipped: no C++ compiler ($CXX or g++) to build the CUDA emulator");
        return;
    };
    let dir = scratch_dir("wmma");
    let ctx = Context::new();
    let mut items = Vec::new();
    for dtype in [DType::F16, DType::BF16] {
        let other = if dtype == DType::F16 {
            DType::BF16
        } else {
            DType::F16
        };
        // f32 values, and `dtype` buffers of them (inputs of the product's kernel: a
        // cast computed in the graph would be the product's prologue, staged element by
        // element; those are the cases at the end).
        let xf =
            |shape: &[usize]| ctx.rand_normal(shape, 0.5, 2.0, shape.iter().sum::<usize>() as u64);
        let x = |shape: &[usize]| {
            ctx.from_array(&xf(shape).cast(dtype).eval().expect("a half operand"))
        };
        let mm = |m: usize, n: usize, k: usize| x(&[m, k]).matmul(&x(&[k, n]));
        let cases: Vec<(String, Tensor)> = vec![
            (
                "prologue: f32 operands rounded to the half type, 24x40x72".into(),
                xf(&[24, 72]).cast(dtype).matmul(&xf(&[72, 40]).cast(dtype)),
            ),
            (
                "prologue: a scale then a rounding, transposed rhs, 17x33x65".into(),
                (&xf(&[17, 65]) * 0.5)
                    .cast(dtype)
                    .matmul(&x(&[33, 65]).transpose()),
            ),
            (
                "prologue: a scale of a half operand, 16x17x65".into(),
                (&x(&[16, 65]) * 0.125).matmul(&x(&[65, 17])),
            ),
            ("1x7x16".into(), mm(1, 7, 16)),
            ("7x16x17".into(), mm(7, 16, 17)),
            ("16x17x65".into(), mm(16, 17, 65)),
            ("17x65x1".into(), mm(17, 65, 1)),
            ("65x1x7".into(), mm(65, 1, 7)),
            ("65x65x65, relu".into(), mm(65, 65, 65).relu()),
            ("130x40x70, several tiles".into(), mm(130, 40, 70)),
            ("K = 0, plus 1.5".into(), &mm(5, 6, 0) + 1.5),
            // Inner axes of multiples of 8: staged in 16-byte copies.
            ("24x40x72, 16-byte copies".into(), mm(24, 40, 72)),
            (
                "x @ w.T, 16-byte copies along K (b col-major)".into(),
                x(&[7, 64]).matmul(&x(&[40, 64]).transpose()),
            ),
            (
                "x.T @ w, 16-byte copies along M (a col-major)".into(),
                x(&[64, 24]).transpose().matmul(&x(&[64, 40])),
            ),
            (
                "batch of 3 @ w, 16-byte copies, rhs broadcast".into(),
                x(&[3, 24, 64]).matmul(&x(&[64, 16])),
            ),
            (
                "gelu(x @ w + b), 17x65x65".into(),
                (&mm(17, 65, 65) + &x(&[65])).gelu(),
            ),
            (
                "gelu(x @ w + b) cast to the other half type".into(),
                (&mm(16, 33, 17) + &x(&[33])).gelu().cast(other),
            ),
            ("x @ w cast to f32".into(), mm(7, 65, 33).cast(DType::F32)),
            (
                "rhs transposed".into(),
                x(&[7, 65]).matmul(&x(&[33, 65]).transpose()),
            ),
            (
                "batch of 3, rhs broadcast".into(),
                x(&[3, 17, 65]).matmul(&x(&[65, 16])),
            ),
            (
                "batch 2x3 broadcast both ways, lhs transposed".into(),
                x(&[2, 1, 65, 7])
                    .permute(&[0, 1, 3, 2])
                    .matmul(&x(&[3, 65, 17])),
            ),
        ];
        for (name, out) in &cases {
            for (threads, grid) in [(256, 3), (64, 2), (32, 1)] {
                let opts = CudaOptions {
                    max_block_size: threads,
                    max_grid_size: grid,
                    compute_capability: Some((8, 0)),
                };
                let kernels = kernels_of(&ctx, std::slice::from_ref(out));
                let products: Vec<Kernel> = kernels
                    .into_iter()
                    .filter(|k| k.contraction.is_some())
                    .collect();
                assert_eq!(products.len(), 1, "{dtype} {name}: one product kernel");
                let k = products.into_iter().next().expect("one");
                let ck = emit(&k, &opts).unwrap_or_else(|e| panic!("{dtype} {name}: {e}"));
                assert!(
                    ck.strategy.contains("tensor cores"),
                    "{dtype} {name}: {}",
                    ck.strategy
                );
                assert!(
                    ck.strategy.contains("in 16-byte copies") || !name.contains("16-byte copies"),
                    "{dtype} {name}: {}",
                    ck.strategy
                );
                items.push((k, opts, format!("{dtype} {name} ({threads} threads)")));
            }
        }
    }
    check_kernels_within(&cxx, &dir, &items, &wmma_tolerance);
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------------------
// Positions and gathers: kernels built by hand (the passes do not produce them yet).

/// A kernel body under construction, one instruction a `push`.
#[derive(Default)]
struct Body(Vec<Instr>);

impl Body {
    fn push(&mut self, dtype: DType, expr: Expr) -> ValueId {
        self.0.push(Instr { dtype, expr });
        ValueId(self.0.len() as u32 - 1)
    }

    fn int(&mut self, v: i64) -> ValueId {
        self.push(DType::I64, Expr::Const(Scalar::I(v)))
    }

    fn binary(&mut self, dtype: DType, op: BinaryOp, a: ValueId, b: ValueId) -> ValueId {
        self.push(dtype, Expr::Binary(op, a, b))
    }
}

fn view(dims: &[usize], strides: &[isize], offset: isize) -> View {
    View {
        shape: Shape::new(dims.to_vec()),
        strides: strides.to_vec(),
        offset,
    }
}

/// An element-wise kernel over `domain` storing `out` into its one output.
fn elementwise_kernel(
    name: &str,
    domain: &[usize],
    inputs: Vec<Buffer>,
    body: Body,
    out: ValueId,
) -> Kernel {
    let domain = Shape::new(domain.to_vec());
    let dtype = body.0[out.index()].dtype;
    let k = Kernel {
        name: name.into(),
        outputs: vec![Buffer {
            dtype,
            len: domain.numel(),
        }],
        domain,
        reduce_axes: vec![],
        inputs,
        body: body.0,
        stores: vec![Store {
            value: out,
            output: 0,
        }],
        plan: Plan::Elementwise,
        plan_reason: "element-wise".into(),
        contraction: None,
    };
    k.check()
        .unwrap_or_else(|e| panic!("{name} is not a valid kernel: {e:?}\n{k}"));
    k
}

/// `iota * 2 + 1` as `dtype`, the iota's positions read through `strides` from `offset`.
fn position_kernel(dtype: DType, dims: &[usize], strides: &[isize], offset: isize) -> Kernel {
    let mut b = Body::default();
    let pos = b.push(
        DType::I64,
        Expr::Position {
            view: view(dims, strides, offset),
        },
    );
    let two = b.int(2);
    let twice = b.binary(DType::I64, BinaryOp::Mul, pos, two);
    let one = b.int(1);
    let odd = b.binary(DType::I64, BinaryOp::Add, twice, one);
    let out = b.push(dtype, Expr::Cast(odd));
    elementwise_kernel("k0_position_mul_add_cast", dims, vec![], b, out)
}

/// `x[idx]` along axis 0: rows of `x: dtype[rows, cols]` picked by `idx: i64[n]`; a
/// user's index when `checked` (the reference refuses one out of range), else one the
/// clamp takes care of.
fn gather_rows_kernel(dtype: DType, rows: usize, cols: usize, n: usize, checked: bool) -> Kernel {
    let dims = [n, cols];
    let mut b = Body::default();
    let idx = b.push(
        DType::I64,
        Expr::Load {
            input: 1,
            view: view(&dims, &[1, 0], 0),
        },
    );
    let out = b.push(
        dtype,
        Expr::Gather {
            input: 0,
            view: view(&dims, &[0, 1], 0),
            axes: vec![GatherAxis {
                index: idx,
                stride: cols as isize,
                extent: rows,
                checked: checked.then_some(0),
            }],
        },
    );
    let inputs = vec![
        Buffer {
            dtype,
            len: rows * cols,
        },
        Buffer {
            dtype: DType::I64,
            len: n,
        },
    ];
    elementwise_kernel("k0_gather", &dims, inputs, b, out)
}

/// `take_along_axis(x, idx, -1)`: `x: dtype[6, 10]` read along its last axis at
/// `idx: i32[6, 20]`, plus 1.
fn gather_last_kernel(dtype: DType) -> Kernel {
    let dims = [6, 20];
    let mut b = Body::default();
    let idx = b.push(
        DType::I32,
        Expr::Load {
            input: 1,
            view: View::contiguous(Shape::new(dims.to_vec())),
        },
    );
    let g = b.push(
        dtype,
        Expr::Gather {
            input: 0,
            view: view(&dims, &[10, 0], 0),
            axes: vec![GatherAxis {
                index: idx,
                stride: 1,
                extent: 10,
                checked: Some(1),
            }],
        },
    );
    let one = b.push(dtype, Expr::Const(Scalar::F(1.0)));
    let out = b.binary(dtype, BinaryOp::Add, g, one);
    let inputs = vec![
        Buffer { dtype, len: 60 },
        Buffer {
            dtype: DType::I32,
            len: 120,
        },
    ];
    elementwise_kernel("k0_gather_add", &dims, inputs, b, out)
}

/// A constant pad of `x[1:, 1:]` (`x: dtype[8, 6]`, so 7 x 5 from offset 7) by (1, 2)
/// rows and (3, 1) columns with 0, as the passes lower it: the coordinates shifted and
/// clamped into the input with max / min, one gather of both axes, and a select.
fn pad_kernel(dtype: DType) -> Kernel {
    let dims = [10, 9];
    let mut b = Body::default();
    let mut inside = None;
    let mut at = Vec::new();
    for (axis, (before, extent)) in [(1i64, 7i64), (3, 5)].into_iter().enumerate() {
        let mut strides = [0isize; 2];
        strides[axis] = 1;
        let coord = b.push(
            DType::I64,
            Expr::Position {
                view: view(&dims, &strides, 0),
            },
        );
        let shift = b.int(before);
        let i = b.binary(DType::I64, BinaryOp::Sub, coord, shift);
        let (zero, last) = (b.int(0), b.int(extent - 1));
        let low = b.binary(DType::I64, BinaryOp::Max, i, zero);
        at.push(b.binary(DType::I64, BinaryOp::Min, low, last));
        let ge = b.binary(DType::Bool, BinaryOp::Ge, i, zero);
        let le = b.binary(DType::Bool, BinaryOp::Le, i, last);
        let both = b.binary(DType::Bool, BinaryOp::And, ge, le);
        inside = Some(match inside {
            None => both,
            Some(prev) => b.binary(DType::Bool, BinaryOp::And, prev, both),
        });
    }
    let g = b.push(
        dtype,
        Expr::Gather {
            input: 0,
            view: view(&dims, &[0, 0], 7),
            axes: vec![
                GatherAxis {
                    index: at[0],
                    stride: 6,
                    extent: 7,
                    checked: None,
                },
                GatherAxis {
                    index: at[1],
                    stride: 1,
                    extent: 5,
                    checked: None,
                },
            ],
        },
    );
    let zero = b.push(dtype, Expr::Const(Scalar::F(0.0)));
    let inside = inside.expect("two axes");
    let out = b.push(dtype, Expr::Where(inside, g, zero));
    elementwise_kernel(
        "k0_position_sub_max_min_gather_where",
        &dims,
        vec![Buffer { dtype, len: 48 }],
        b,
        out,
    )
}

/// The kernels above in `dtype`: (what, kernel).
fn position_and_gather_kernels(dtype: DType) -> Vec<(String, Kernel)> {
    vec![
        (
            format!("{dtype} iota [5, 37] from 3, scalar loop"),
            position_kernel(dtype, &[5, 37], &[37, 1], 3),
        ),
        (
            format!("{dtype} iota [64, 8] transposed, vectorised"),
            position_kernel(dtype, &[8, 64], &[1, 8], 0),
        ),
        (
            format!("{dtype} gather of rows, i64 indices, vectorised"),
            gather_rows_kernel(dtype, 9, 16, 12, true),
        ),
        (
            format!("{dtype} gather of rows, unchecked i64 indices clamped, scalar loop"),
            gather_rows_kernel(dtype, 5, 15, 13, false),
        ),
        (
            format!("{dtype} gather along the last axis, i32 indices"),
            gather_last_kernel(dtype),
        ),
        (
            format!("{dtype} pad of a slice, two-axis gather"),
            pad_kernel(dtype),
        ),
    ]
}

/// `kernel`, a contraction's, with `x[m, n - 5]` added to its stored value: `x` the lhs
/// operand read through the contraction's view at a gathered column (a coordinate of
/// the domain minus 5: negative at first, past K for wide products, so wrapped and
/// clamped).
fn with_gathered_epilogue(mut kernel: Kernel) -> Kernel {
    let c = kernel.contraction.clone().expect("a contraction kernel");
    let rank = kernel.domain.rank();
    let dims = kernel.domain.dims().to_vec();
    let lhs = kernel.inputs[c.lhs].dtype;
    let mut b = Body(std::mem::take(&mut kernel.body));
    let mut strides = vec![0isize; rank];
    strides[rank - 1] = 1;
    let n = b.push(
        DType::I64,
        Expr::Position {
            view: view(&dims, &strides, 0),
        },
    );
    let five = b.int(5);
    let col = b.binary(DType::I64, BinaryOp::Sub, n, five);
    let mut fixed = c.lhs_view.strides.clone();
    fixed[rank - 1] = 0;
    let g = b.push(
        lhs,
        Expr::Gather {
            input: c.lhs,
            view: view(&dims, &fixed, c.lhs_view.offset),
            axes: vec![GatherAxis {
                index: col,
                stride: c.lhs_view.strides[rank - 1],
                extent: c.lhs_view.shape.dims()[rank - 1],
                checked: None,
            }],
        },
    );
    let stored = kernel.stores[0].value;
    let dtype = b.0[stored.index()].dtype;
    let g = if lhs == dtype {
        g
    } else {
        b.push(dtype, Expr::Cast(g))
    };
    kernel.stores[0].value = b.binary(dtype, BinaryOp::Add, stored, g);
    kernel.body = b.0;
    kernel.name.push_str("_gather_add");
    kernel
        .check()
        .unwrap_or_else(|e| panic!("{} is not a valid kernel: {e:?}\n{kernel}", kernel.name));
    kernel
}

/// Index buffers hold -8..=8: in range for the checked axes (extents 9 and 10), from
/// the end when negative; wrapped and clamped past either end for the unchecked axis of
/// 5. Other inputs are random.
fn index_or_random_input(j: usize, b: &Buffer) -> HostArray {
    match b.dtype {
        DType::I32 | DType::I64 => {
            let v: Vec<i64> = (0..b.len as i64)
                .map(|e| (e * 7 + j as i64) % 17 - 8)
                .collect();
            HostArray::new(Shape::new([b.len]), Storage::from_i64s(b.dtype, &v))
                .expect("length matches")
        }
        _ => random_input(b.dtype, b.len, 1 + j as u64),
    }
}

/// Positions (an iota through views, coordinates) and gathers (user indices of i64 and
/// i32, negative and out of range; a pad's two-axis gather of clamped coordinates) in
/// f32, f16 and f64, vectorised and not, and in matrix-product epilogues.
#[test]
fn positions_and_gathers_compute_what_the_reference_does() {
    let Some(cxx) = compiler() else {
        eprintln!("skipped: no C++ compiler ($CXX or g++) to build the CUDA emulator");
        return;
    };
    let dir = scratch_dir("gathers");
    let mut items = Vec::new();
    for dtype in [DType::F32, DType::F16, DType::F64] {
        for (what, k) in position_and_gather_kernels(dtype) {
            items.push((k, SMALL_GRID, what));
        }
    }
    items.push((
        position_kernel(DType::F64, &[5, 37], &[37, 1], 3_000_000_000),
        SMALL_GRID,
        "f64 iota [5, 37] from 3e9, 64-bit indices".into(),
    ));
    let vec4 = items
        .iter()
        .filter(|(k, o, _)| emit(k, o).is_ok_and(|c| c.source.contains("#pragma unroll")))
        .count();
    assert!(
        vec4 >= 9,
        "{vec4} vectorised kernels, not the 9 the shapes allow"
    );
    let ctx = Context::new();
    let x = |shape: &[usize]| ctx.rand_normal(shape, 0.5, 2.0, shape.iter().sum::<usize>() as u64);
    for dtype in [DType::F32, DType::F64] {
        let mm = x(&[7, 65]).cast(dtype).matmul(&x(&[65, 80]).cast(dtype));
        let products: Vec<Kernel> = kernels_of(&ctx, &[mm])
            .into_iter()
            .filter(|k| k.contraction.is_some())
            .collect();
        assert_eq!(products.len(), 1, "{dtype}: one product kernel");
        for k in products {
            let what = format!("{dtype} 7x65x80 product + x[m, n - 5]");
            items.push((with_gathered_epilogue(k), SMALL_GRID, what));
        }
    }
    check_kernels_on(
        &cxx,
        &dir,
        &items,
        &|_, _, dtype, _, want| {
            let (rtol, atol) = tolerance(dtype);
            atol + rtol * want.abs()
        },
        &index_or_random_input,
    );
    let _ = std::fs::remove_dir_all(&dir);
}
