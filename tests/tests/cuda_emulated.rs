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
use ndfuse_ir::{Buffer, HostArray, Kernel, Shape, Storage};
use ndfuse_passes::TargetDesc;
use ndfuse_tests::catalogue::CATALOGUE;
use ndfuse_tests::hand_kernels::*;
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

/// Runs the launches of emitted function set `b{i}` of `lib`, in order, on `args` (one
/// live, 64-byte aligned buffer per parameter: inputs or operands, outputs, scratch,
/// each at least as large as the kernel or routine reads or writes).
fn launch_all(
    lib: &libloading::Library,
    i: usize,
    launches: &[ndfuse_codegen_cuda::Launch],
    args: &[*mut u8],
) {
    // SAFETY: `nd_emu_launch` is defined by cuda_emu.h with exactly this signature.
    let launch: libloading::Symbol<Launch> =
        unsafe { lib.get(b"nd_emu_launch\0") }.expect("nd_emu_launch");
    for l in launches {
        let name = format!("b{i}_{}\0", l.function);
        // SAFETY: every emitted function takes only pointer parameters; it is called
        // through `nd_emu_launch` with one pointer per parameter.
        let f: libloading::Symbol<*const ()> =
            unsafe { lib.get(name.as_bytes()) }.expect("kernel function");
        // SAFETY: `args` holds one live buffer per parameter, as the caller promises.
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
}

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
    launch_all(lib, i, &ck.launches, &args);
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

// ---------------------------------------------------------------------------------------
// Routines: scatter-add, scans and argsort (`ndfuse_codegen_cuda::emit_routine`), against
// the interpreter's `eval_node`.
// ---------------------------------------------------------------------------------------

/// A routine node of a graph, with its operands' values.
struct RoutineCase {
    what: String,
    node: ndfuse_ir::Node,
    types: Vec<ndfuse_ir::TensorType>,
    inputs: Vec<HostArray>,
}

/// A deterministic stream of pseudo-random u64s.
fn stream(seed: u64) -> impl FnMut() -> u64 {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    }
}

/// `op` applied to inputs of these (dtype, shape, values) as a graph node.
fn routine_case(what: String, op: ndfuse_ir::Op, inputs: Vec<HostArray>) -> RoutineCase {
    let mut g = ndfuse_ir::Graph::new();
    let ids: Vec<_> = inputs
        .iter()
        .enumerate()
        .map(|(i, a)| g.add_input(format!("in{i}"), a.dtype(), a.shape().clone()))
        .collect();
    let n = g.add(op, &ids).unwrap_or_else(|e| panic!("{what}: {e}"));
    RoutineCase {
        what,
        node: g.node(n).clone(),
        types: ids.iter().map(|&i| g.ty(i)).collect(),
        inputs,
    }
}

/// Values of `dtype` and `shape`: floats from `floats`, ints in `lo..hi`.
fn values(dtype: DType, shape: &[usize], seed: u64, floats: &dyn Fn(u64) -> f64) -> HostArray {
    let mut next = stream(seed);
    let len: usize = shape.iter().product();
    let shape = Shape::new(shape.to_vec());
    match dtype {
        DType::I32 | DType::I64 => {
            let v: Vec<i64> = (0..len).map(|_| (next() % 2001) as i64 - 1000).collect();
            HostArray::new(shape, Storage::from_i64s(dtype, &v)).expect("length matches")
        }
        DType::Bool => {
            let v: Vec<bool> = (0..len).map(|_| next().is_multiple_of(2)).collect();
            HostArray::new(shape, Storage::Bool(v)).expect("length matches")
        }
        _ => {
            let v: Vec<f64> = (0..len).map(|_| floats(next())).collect();
            HostArray::from_f64s(dtype, shape, &v)
        }
    }
}

fn uniform(u: u64) -> f64 {
    (u >> 11) as f64 / (1u64 << 53) as f64
}

/// Indices in `-n..n` (so with duplicates and negatives), of `dtype`.
fn indices(dtype: DType, shape: &[usize], n: usize, seed: u64) -> HostArray {
    let mut next = stream(seed);
    let len: usize = shape.iter().product();
    let v: Vec<i64> = (0..len)
        .map(|_| (next() % (2 * n as u64)) as i64 - n as i64)
        .collect();
    HostArray::new(Shape::new(shape.to_vec()), Storage::from_i64s(dtype, &v))
        .expect("length matches")
}

/// The emitted routine of `c` under `opts`, which must have a kernel.
fn routine_kernel(c: &RoutineCase, opts: &CudaOptions) -> CudaKernel {
    match ndfuse_codegen_cuda::emit_routine(&c.node, &c.types, opts) {
        Ok(ndfuse_codegen_cuda::RoutineCode::Kernel(k)) => k,
        Ok(ndfuse_codegen_cuda::RoutineCode::Host(why)) => panic!("{}: no kernel: {why}", c.what),
        Err(e) => panic!("{}: {e}", c.what),
    }
}

/// Runs routine kernel `i` of a [`build`] on `c`'s inputs; returns the output.
fn run_routine_emulated(
    lib: &libloading::Library,
    i: usize,
    c: &RoutineCase,
    ck: &CudaKernel,
) -> HostArray {
    let mut bufs: Vec<Aligned> = Vec::new();
    for a in &c.inputs {
        let n = a.len() * a.dtype().size_bytes();
        let b = Aligned::new(n, 0);
        // SAFETY: `b` holds at least `n` bytes; the storage holds exactly `n` bytes.
        unsafe { std::ptr::copy_nonoverlapping(a.storage().as_ptr(), b.ptr, n) };
        bufs.push(b);
    }
    let len = c.node.shape.numel();
    bufs.push(Aligned::new(len * c.node.dtype.size_bytes(), 0xff));
    if ck.scratch_bytes > 0 {
        bufs.push(Aligned::new(ck.scratch_bytes, 0xff));
    }
    let args: Vec<*mut u8> = bufs.iter().map(|b| b.ptr).collect();
    launch_all(lib, i, &ck.launches, &args);
    let bytes = bufs[c.inputs.len()].bytes(len * c.node.dtype.size_bytes());
    from_bytes(c.node.dtype, len, bytes)
        .unwrap_or_else(|e| panic!("{}: {e}\n{}", c.what, ck.source))
        .reshaped(c.node.shape.clone())
        .expect("same length")
}

/// Unit roundoff of a dtype's arithmetic.
fn unit(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => f64::EPSILON,
        _ => f32::EPSILON as f64,
    }
}

/// A case's tolerance: given the element and the reference value, the largest difference
/// allowed.
type RoutineTolerance = Box<dyn Fn(usize, f64) -> f64>;

/// Emits, builds and runs every case under `opts`, comparing with `eval_node` within
/// `tol(case)(element, reference)`.
fn check_routines(
    cxx: &str,
    dir: &Path,
    cases: &[RoutineCase],
    opts: &CudaOptions,
    tol: &dyn Fn(&RoutineCase) -> RoutineTolerance,
) {
    let cks: Vec<CudaKernel> = cases.iter().map(|c| routine_kernel(c, opts)).collect();
    let lib = build(cxx, dir, &cks.iter().collect::<Vec<_>>());
    for (i, (c, ck)) in cases.iter().zip(&cks).enumerate() {
        let refs: Vec<&HostArray> = c.inputs.iter().collect();
        let want = ndfuse_ir::interp::eval_node(&c.node, &refs)
            .unwrap_or_else(|e| panic!("{}: {e}", c.what));
        let got = run_routine_emulated(&lib, i, c, ck);
        assert_eq!(got.dtype(), want.dtype(), "{}: dtype", c.what);
        let (gv, wv) = (got.to_f64s(), want.to_f64s());
        assert_eq!(gv.len(), wv.len(), "{}: length", c.what);
        let tol = tol(c);
        for (e, (a, b)) in gv.iter().zip(&wv).enumerate() {
            let bound = tol(e, *b);
            let ok = (a.is_nan() && b.is_nan())
                || a == b
                || (a.is_finite() && b.is_finite() && (a - b).abs() <= bound);
            assert!(
                ok,
                "{}: {} element {e}: emulated CUDA {a:e}, reference {b:e}, allowed {bound:e}\n{}",
                c.what, ck.name, ck.source
            );
        }
    }
}

fn scatter_cases() -> Vec<RoutineCase> {
    let mut cases = Vec::new();
    let normal = |u: u64| 0.5 + 4.0 * (uniform(u) - 0.5);
    // (x shape, axis, m: the indexed extent of idx and v)
    let shapes: [(&[usize], usize, usize); 7] = [
        (&[6, 5, 4], 0, 9),
        (&[3, 7, 5], 1, 12),
        (&[4, 3, 9], 2, 20),
        (&[300], 0, 700),
        (&[5, 1, 33], 1, 6),
        (&[4, 6, 3], 1, 0),
        (&[0, 4], 1, 3),
    ];
    for (si, &(shape, axis, m)) in shapes.iter().enumerate() {
        for (di, dtype) in [
            DType::F32,
            DType::F64,
            DType::F16,
            DType::BF16,
            DType::I32,
            DType::I64,
        ]
        .into_iter()
        .enumerate()
        {
            let idx_dtype = if (si + di) % 2 == 0 {
                DType::I64
            } else {
                DType::I32
            };
            let mut is = shape.to_vec();
            is[axis] = m;
            let seed = (si * 10 + di) as u64;
            let x = values(dtype, shape, seed, &normal);
            let idx = indices(idx_dtype, &is, shape[axis].max(1), seed + 100);
            let v = values(dtype, &is, seed + 200, &normal);
            cases.push(routine_case(
                format!("scatter_add {dtype} {shape:?} axis {axis}, {m} {idx_dtype} indices"),
                ndfuse_ir::Op::ScatterAdd { axis },
                vec![x, idx, v],
            ));
        }
    }
    cases
}

/// The bound of a scatter-add element: each accumulation rounds in the dtype (f32 for
/// halves, then once to the half).
fn scatter_tolerance(c: &RoutineCase) -> RoutineTolerance {
    let d = c.node.dtype;
    let (rtol, _) = tolerance(d);
    let m = c.inputs[1].len() as f64;
    Box::new(move |_, want| rtol * want.abs() + 8.0 * m.max(1.0) * unit(d) * 16.0)
}

#[test]
fn scatter_add_routines_compute_what_the_reference_does() {
    let Some(cxx) = compiler() else {
        eprintln!("skipped: no C++ compiler ($CXX or g++) to build the CUDA emulator");
        return;
    };
    let dir = scratch_dir("scatter_add");
    check_routines(
        &cxx,
        &dir,
        &scatter_cases(),
        &SMALL_GRID,
        &scatter_tolerance,
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn scan_cases() -> Vec<RoutineCase> {
    let mut cases = Vec::new();
    // (shape, axis): thread per lane (short axes; wide inner), block per lane (long
    // axes, several chunks, a partial last chunk; strided lanes), size 1 and 0 axes.
    let shapes: [(&[usize], usize); 10] = [
        (&[5, 7, 3], 0),
        (&[5, 7, 3], 1),
        (&[5, 7, 3], 2),
        (&[3, 2500], 1),
        (&[2, 1500, 3], 1),
        (&[2100, 2], 0),
        (&[2, 100, 1024], 1),
        (&[4, 1, 3], 1),
        (&[4, 0, 3], 1),
        (&[1, 1030], 1),
    ];
    for (si, &(shape, axis)) in shapes.iter().enumerate() {
        for (di, dtype) in [
            DType::F32,
            DType::F64,
            DType::F16,
            DType::BF16,
            DType::I32,
            DType::I64,
        ]
        .into_iter()
        .enumerate()
        {
            for op in [ndfuse_ir::ScanOp::Sum, ndfuse_ir::ScanOp::Prod] {
                // The big shapes once per dtype family, to keep the emulator quick.
                let big = shape.iter().product::<usize>() > 10_000;
                if big && (op == ndfuse_ir::ScanOp::Prod) == (di % 2 == 0) {
                    continue;
                }
                let reverse = (si + di) % 2 == 1;
                let seed = (si * 100 + di * 10) as u64 + op as u64;
                // Products of factors near 1 stay in range along 2500 positions.
                let x = match op {
                    ndfuse_ir::ScanOp::Sum => {
                        values(dtype, shape, seed, &|u| 0.5 + 4.0 * (uniform(u) - 0.5))
                    }
                    ndfuse_ir::ScanOp::Prod => {
                        values(dtype, shape, seed, &|u| 1.0 + 0.02 * (uniform(u) - 0.5))
                    }
                };
                cases.push(routine_case(
                    format!(
                        "{}{} {dtype} {shape:?} axis {axis}",
                        if reverse { "reverse " } else { "" },
                        op.name()
                    ),
                    ndfuse_ir::Op::Scan { op, axis, reverse },
                    vec![x],
                ));
            }
        }
    }
    cases
}

/// The bound of a scan element: the summation's error bound over the lane's prefix
/// (sums; a product's relative error likewise), plus the rounding of each store.
fn scan_tolerance(c: &RoutineCase) -> RoutineTolerance {
    let d = c.node.dtype;
    if d.is_int() {
        return Box::new(|_, _| 0.0);
    }
    let (rtol, _) = tolerance(d);
    let (axis, reverse, op) = match c.node.op {
        ndfuse_ir::Op::Scan { axis, reverse, op } => (axis, reverse, op),
        _ => unreachable!("a scan case"),
    };
    let dims = c.node.shape.dims();
    let (n, inner): (usize, usize) = (dims[axis], dims[axis + 1..].iter().product());
    let depth = n.min(128) as f64 + (n / 1024) as f64 + 16.0;
    let u = unit(d);
    match op {
        ndfuse_ir::ScanOp::Prod => Box::new(move |_, want| (rtol + depth * u) * want.abs()),
        ndfuse_ir::ScanOp::Sum => {
            // Σ|x| over each lane's positions up to each element, in scan order.
            let x = c.inputs[0].to_f64s();
            let mut s = vec![0.0; x.len()];
            for o in 0..x.len() / (n * inner).max(1) {
                for i in 0..inner {
                    let mut run = 0.0;
                    for q in 0..n {
                        let j = if reverse { n - 1 - q } else { q };
                        let e = (o * n + j) * inner + i;
                        run += x[e].abs();
                        s[e] = run;
                    }
                }
            }
            Box::new(move |e, want| rtol * want.abs() + depth * u * s[e])
        }
    }
}

#[test]
fn scan_routines_compute_what_the_reference_does() {
    let Some(cxx) = compiler() else {
        eprintln!("skipped: no C++ compiler ($CXX or g++) to build the CUDA emulator");
        return;
    };
    let dir = scratch_dir("scan");
    check_routines(&cxx, &dir, &scan_cases(), &SMALL_GRID, &scan_tolerance);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Floats drawn from a few values, so that rows have ties, NaNs, both zeros, infinities.
fn tied(u: u64) -> f64 {
    [
        -1.0,
        0.0,
        -0.0,
        1.0,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        2.5,
        -3.0,
        0.25,
    ][(u % 10) as usize]
}

fn argsort_cases() -> Vec<RoutineCase> {
    let mut cases = Vec::new();
    // (shape, axis, k below the extent when Some)
    let shapes: [(&[usize], usize, Option<usize>); 9] = [
        (&[6, 5, 4], 0, None),
        (&[3, 7, 5], 1, Some(3)),
        (&[4, 3, 37], 2, None),
        (&[2, 1000], 1, Some(10)),
        (&[2048, 2], 0, None),
        (&[5, 1, 3], 1, None),
        (&[4, 0, 3], 1, None),
        (&[3, 64], 1, Some(0)),
        (&[1, 33], 1, Some(32)),
    ];
    for (si, &(shape, axis, k)) in shapes.iter().enumerate() {
        for (di, dtype) in [
            DType::F32,
            DType::F64,
            DType::F16,
            DType::BF16,
            DType::I32,
            DType::I64,
            DType::Bool,
        ]
        .into_iter()
        .enumerate()
        {
            for descending in [false, true] {
                if shape[axis] == 2048 && descending == (di % 2 == 0) {
                    continue;
                }
                let seed = (si * 100 + di * 10) as u64 + u64::from(descending);
                // Half the float cases tied values, half continuous ones.
                let x = if (si + di) % 2 == 0 {
                    values(dtype, shape, seed, &tied)
                } else {
                    values(dtype, shape, seed, &|u| 4.0 * (uniform(u) - 0.5))
                };
                let k = k.unwrap_or(shape[axis]);
                cases.push(routine_case(
                    format!(
                        "argsort {dtype} {shape:?} axis {axis}, k {k}{}",
                        if descending { ", descending" } else { "" }
                    ),
                    ndfuse_ir::Op::Argsort {
                        axis,
                        descending,
                        k,
                    },
                    vec![x],
                ));
            }
        }
    }
    cases
}

#[test]
fn argsort_routines_compute_what_the_reference_does() {
    let Some(cxx) = compiler() else {
        eprintln!("skipped: no C++ compiler ($CXX or g++) to build the CUDA emulator");
        return;
    };
    let dir = scratch_dir("argsort");
    check_routines(&cxx, &dir, &argsort_cases(), &SMALL_GRID, &|_| {
        Box::new(|_, _| 0.0)
    });
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn argsort_rows_past_the_bound_run_on_the_host() {
    let x = values(DType::F32, &[2, 2049], 1, &uniform_f64);
    let c = routine_case(
        "argsort of 2049".into(),
        ndfuse_ir::Op::Argsort {
            axis: 1,
            descending: false,
            k: 2049,
        },
        vec![x],
    );
    match ndfuse_codegen_cuda::emit_routine(&c.node, &c.types, &CudaOptions::default()) {
        Ok(ndfuse_codegen_cuda::RoutineCode::Host(why)) => {
            assert!(why.contains("2049"), "{why}")
        }
        other => panic!("expected the host: {other:?}"),
    }
}

fn uniform_f64(u: u64) -> f64 {
    uniform(u)
}

#[test]
fn routine_results_do_not_depend_on_the_launch_shape() {
    let Some(cxx) = compiler() else {
        eprintln!("skipped: no C++ compiler ($CXX or g++) to build the CUDA emulator");
        return;
    };
    let dir = scratch_dir("routine_shapes");
    let normal = |u: u64| 0.5 + 4.0 * (uniform(u) - 0.5);
    let mut cases = vec![
        routine_case(
            "cumsum f32 [3, 2500]".into(),
            ndfuse_ir::Op::Scan {
                op: ndfuse_ir::ScanOp::Sum,
                axis: 1,
                reverse: false,
            },
            vec![values(DType::F32, &[3, 2500], 7, &normal)],
        ),
        routine_case(
            "cumsum f32 [2, 100, 1024]".into(),
            ndfuse_ir::Op::Scan {
                op: ndfuse_ir::ScanOp::Sum,
                axis: 1,
                reverse: true,
            },
            vec![values(DType::F32, &[2, 100, 1024], 8, &normal)],
        ),
        routine_case(
            "scatter_add f32 [40, 30]".into(),
            ndfuse_ir::Op::ScatterAdd { axis: 0 },
            vec![
                values(DType::F32, &[40, 30], 9, &normal),
                indices(DType::I64, &[200, 30], 40, 10),
                values(DType::F32, &[200, 30], 11, &normal),
            ],
        ),
    ];
    // Attention: 64 rows a block, then 32 (the tiles of keys stay as they are).
    let attn = attn_cases();
    cases.push(attention_case(&attn[1], false, 12));
    cases.push(attention_case(&attn[5], false, 13));
    cases.push(attention_case(&attn[2], true, 14));
    cases.push(attention_case(&attn[5], true, 15));
    let shapes = [(256, 7), (32, 1), (128, 3)];
    let mut runs: Vec<Vec<Vec<u8>>> = Vec::new();
    for (block, grid) in shapes {
        let opts = CudaOptions {
            max_block_size: block,
            max_grid_size: grid,
            compute_capability: None,
        };
        let cks: Vec<CudaKernel> = cases.iter().map(|c| routine_kernel(c, &opts)).collect();
        let lib = build(&cxx, &dir, &cks.iter().collect::<Vec<_>>());
        runs.push(
            cases
                .iter()
                .zip(&cks)
                .enumerate()
                .map(|(i, (c, ck))| {
                    let out = run_routine_emulated(&lib, i, c, ck);
                    let n = out.len() * out.dtype().size_bytes();
                    // SAFETY: the storage holds `n` bytes of plain elements.
                    unsafe { std::slice::from_raw_parts(out.storage().as_ptr(), n) }.to_vec()
                })
                .collect(),
        );
    }
    for (r, (block, grid)) in runs.iter().zip(shapes).skip(1) {
        for (c, (a, b)) in cases.iter().zip(r.iter().zip(&runs[0])) {
            assert!(
                a == b,
                "{}: other bits with {block} threads x {grid} blocks",
                c.what
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------------------
// Attention (`Op::Attention`, `Op::AttentionBackward`): the emitted routine against the
// interpreter's f64 formulas. Tolerances, per element, relative to the element plus the
// same relative to the largest magnitude of its segment (the output; dq, dk, dv of the
// backward), since the sums over keys cancel: f64 1e-12, f32 2e-5, f16 2e-3 and bf16
// 1.6e-2 (the rounding of one store, about one unit of their precision; the backward's
// `D_i = do_i . o_i` reads the rounded forward result, which the reference's
// `sum_j p_ij dp_ij` does not).
// ---------------------------------------------------------------------------------------

/// One attention test: extents `[B, Hq, Hkv, Tq, Tk, D, Dv]`, mask, layout and extras.
struct AttnCase {
    dtype: DType,
    dims: [usize; 7],
    causal: ndfuse_ir::CausalMask,
    layout: ndfuse_ir::AttentionLayout,
    /// The bias's dtype and extents (`[B|1, Hq|1, Tq|1, Tk|1]`): values in -1..1, with
    /// `-inf` at every 7th element and along the whole of its second row.
    bias: Option<(DType, [usize; 4])>,
    lengths: Option<Vec<i64>>,
    dropout: Option<f64>,
}

/// `AttnCase` as the routine node (`backward`: of its gradient, on the forward's result
/// as `o`, as the gradient rule passes it) with its operands.
fn attention_case(c: &AttnCase, backward: bool, seed: u64) -> RoutineCase {
    use ndfuse_ir::{AttentionSpec, Op, Scalar};
    let [b, hq, hkv, tq, tk, d, dv] = c.dims;
    let spec = AttentionSpec {
        layout: c.layout,
        causal: c.causal,
        scale: Scalar::F(1.0 / (d as f64).sqrt()),
        bias: c.bias.is_some(),
        key_lengths: c.lengths.is_some(),
        dropout: c.dropout.map(Scalar::F),
    };
    let shape = |h, t, f| c.layout.shape(b, h, t, f);
    let signed = |u: u64| 0.5 + 2.0 * (uniform(u) - 0.5);
    let mut inputs = if let ndfuse_ir::AttentionLayout::Packed { .. } = c.layout {
        assert!(tq == tk && d == dv, "packed: one T and one D");
        vec![values(c.dtype, &[b, tq, (hq + 2 * hkv) * d], seed, &signed)]
    } else {
        vec![
            values(c.dtype, &shape(hq, tq, d), seed, &signed),
            values(c.dtype, &shape(hkv, tk, d), seed + 1, &signed),
            values(c.dtype, &shape(hkv, tk, dv), seed + 2, &signed),
        ]
    };
    let mut extras = Vec::new();
    if let Some((bd, ext)) = c.bias {
        let n: usize = ext.iter().product();
        let row = ext[3];
        let mut next = stream(seed + 3);
        let v: Vec<f64> = (0..n)
            .map(|e| {
                if e % 7 == 3 || (e / row) == 1 {
                    f64::NEG_INFINITY
                } else {
                    2.0 * uniform(next()) - 1.0
                }
            })
            .collect();
        extras.push(HostArray::from_f64s(bd, Shape::new(ext.to_vec()), &v));
    }
    if let Some(l) = &c.lengths {
        extras.push(
            HostArray::new(Shape::new([l.len()]), Storage::from_i64s(DType::I64, l))
                .expect("length matches"),
        );
    }
    if c.dropout.is_some() {
        let key = [-0x1234_5678_9abc - seed as i64];
        extras.push(
            HostArray::new(Shape::scalar(), Storage::from_i64s(DType::I64, &key)).expect("one key"),
        );
    }
    let what = format!(
        "attention{} {} {:?} causal {:?} {:?}{}{}{}",
        if backward { "_backward" } else { "" },
        c.dtype,
        c.dims,
        c.causal,
        c.layout,
        c.bias
            .map(|(bd, e)| format!(", bias {bd} {e:?}"))
            .unwrap_or_default(),
        c.lengths
            .as_ref()
            .map(|l| format!(", key lengths {l:?}"))
            .unwrap_or_default(),
        c.dropout
            .map(|p| format!(", dropout {p}"))
            .unwrap_or_default(),
    );
    let forward = {
        let mut ops = inputs.clone();
        ops.extend(extras.iter().cloned());
        routine_case(what.clone(), Op::Attention(spec), ops)
    };
    if !backward {
        return forward;
    }
    let refs: Vec<&HostArray> = forward.inputs.iter().collect();
    let o = ndfuse_ir::interp::eval_node(&forward.node, &refs).expect("the forward evaluates");
    inputs.push(o);
    inputs.push(values(c.dtype, &shape(hq, tq, dv), seed + 4, &signed));
    inputs.extend(extras);
    routine_case(what, Op::AttentionBackward(spec), inputs)
}

fn attn_cases() -> Vec<AttnCase> {
    use ndfuse_ir::{AttentionLayout as L, CausalMask as M};
    let packed = |q_heads, kv_heads| L::Packed { q_heads, kv_heads };
    let case = |dtype, dims, causal, layout| AttnCase {
        dtype,
        dims,
        causal,
        layout,
        bias: None,
        lengths: None,
        dropout: None,
    };
    vec![
        case(DType::F32, [2, 2, 2, 37, 37, 16, 16], M::None, L::Bhtd),
        // Grouped heads; two blocks of query rows; Tq > Tk.
        case(DType::F32, [1, 4, 2, 70, 45, 16, 24], M::TopLeft, L::Bhtd),
        AttnCase {
            lengths: Some(vec![45, 30]),
            ..case(
                DType::F32,
                [2, 2, 1, 20, 45, 16, 16],
                M::BottomRight,
                L::Bhtd,
            )
        },
        // Bottom-right with Tq > Tk: the first 25 rows see no key; a bias row all -inf.
        AttnCase {
            bias: Some((DType::F32, [1, 1, 45, 20])),
            ..case(
                DType::F32,
                [1, 2, 2, 45, 20, 16, 16],
                M::BottomRight,
                L::Bhtd,
            )
        },
        // Batch 0 has no key at all.
        AttnCase {
            bias: Some((DType::F64, [1, 4, 1, 40])),
            lengths: Some(vec![0, 23]),
            dropout: Some(0.25),
            ..case(DType::F64, [2, 4, 2, 33, 40, 64, 64], M::TopLeft, L::Bhtd)
        },
        AttnCase {
            bias: Some((DType::F32, [2, 1, 30, 50])),
            dropout: Some(0.2),
            ..case(DType::F32, [2, 2, 2, 30, 50, 64, 64], M::None, L::Bthd)
        },
        AttnCase {
            bias: Some((DType::F32, [1, 2, 24, 1])),
            lengths: Some(vec![40, 17]),
            ..case(DType::F16, [2, 2, 1, 24, 40, 16, 16], M::TopLeft, L::Bhtd)
        },
        AttnCase {
            dropout: Some(0.1),
            ..case(
                DType::BF16,
                [1, 2, 2, 20, 30, 64, 32],
                M::BottomRight,
                L::Bhtd,
            )
        },
        AttnCase {
            lengths: Some(vec![-3, 100]),
            ..case(DType::F64, [2, 2, 1, 17, 29, 16, 16], M::None, L::Bthd)
        },
        // One qkv operand; the backward writes qkv's gradient.
        AttnCase {
            lengths: Some(vec![31, 12]),
            dropout: Some(0.15),
            ..case(
                DType::F32,
                [2, 4, 2, 31, 31, 16, 16],
                M::TopLeft,
                packed(4, 2),
            )
        },
        AttnCase {
            bias: Some((DType::F64, [1, 2, 1, 24])),
            ..case(DType::F64, [1, 2, 1, 24, 24, 16, 16], M::None, packed(2, 1))
        },
    ]
}

/// The bound of an attention element (see the section's head): `rtol` of the element
/// plus `rtol` of the largest magnitude in its segment.
fn attention_tolerance(c: &RoutineCase) -> RoutineTolerance {
    let (rtol, _) = tolerance(c.node.dtype);
    let refs: Vec<&HostArray> = c.inputs.iter().collect();
    let want = ndfuse_ir::interp::eval_node(&c.node, &refs)
        .expect("evaluates")
        .to_f64s();
    // Each element's segment: 0 for the forward; 0, 1, 2 for dq, dk, dv (packed: by the
    // head the element's column falls in).
    let segment: Vec<usize> = match c.node.op {
        ndfuse_ir::Op::AttentionBackward(spec) => match spec.layout {
            ndfuse_ir::AttentionLayout::Packed { q_heads, kv_heads } => {
                let row = c.inputs[0].shape().dims()[2];
                let d = row / (q_heads + 2 * kv_heads);
                let head = |e: usize| (e % row) / d;
                (0..want.len())
                    .map(|e| {
                        usize::from(head(e) >= q_heads) + usize::from(head(e) >= q_heads + kv_heads)
                    })
                    .collect()
            }
            _ => (0..3)
                .flat_map(|i| std::iter::repeat_n(i, c.inputs[i].len()))
                .collect(),
        },
        _ => vec![0; want.len()],
    };
    let mut big = [0.0f64; 3];
    for (&s, v) in segment.iter().zip(&want) {
        if v.is_finite() {
            big[s] = big[s].max(v.abs());
        }
    }
    Box::new(move |e, want| rtol * (want.abs() + big[segment[e]]))
}

#[test]
fn attention_routines_compute_what_the_reference_does() {
    let Some(cxx) = compiler() else {
        eprintln!("skipped: no C++ compiler ($CXX or g++) to build the CUDA emulator");
        return;
    };
    let dir = scratch_dir("attention");
    let cases: Vec<RoutineCase> = attn_cases()
        .iter()
        .enumerate()
        .flat_map(|(i, c)| [false, true].map(|backward| attention_case(c, backward, 10 * i as u64)))
        .collect();
    check_routines(&cxx, &dir, &cases, &SMALL_GRID, &attention_tolerance);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn attention_heads_past_the_bound_run_on_the_host() {
    let c = attention_case(
        &AttnCase {
            dtype: DType::F32,
            dims: [1, 1, 1, 2, 2, 300, 8],
            causal: ndfuse_ir::CausalMask::None,
            layout: ndfuse_ir::AttentionLayout::Bhtd,
            bias: None,
            lengths: None,
            dropout: None,
        },
        false,
        1,
    );
    match ndfuse_codegen_cuda::emit_routine(&c.node, &c.types, &CudaOptions::default()) {
        Ok(ndfuse_codegen_cuda::RoutineCode::Host(why)) => assert!(why.contains("300"), "{why}"),
        other => panic!("expected the host: {other:?}"),
    }
}
