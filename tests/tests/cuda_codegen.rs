//! The CUDA C of every kernel of the fusion catalogue, and of graphs chosen to reach
//! every launch strategy (block per row with the row in registers and without, column
//! tiles, split reductions with one and with several sweeps, arg-reductions, halves):
//! pinned as snapshots, and compiled with the real NVRTC for an H100 (`sm_90`). The
//! tensor-core GEMMs (f16 and bf16 operands, emitted for a device that has them) are
//! compiled for `sm_80` and `sm_90` (f16 for `sm_70` too); `<mma.h>` needs `crt/mma.h`,
//! which the PyPI wheels ship in `nvidia-cuda-nvcc-cu12`'s include directory (list it in
//! `NDFUSE_CUDA_INCLUDE` beside `nvidia-cuda-runtime-cu12`'s).
//!
//! NVRTC is loaded at run time. Without it these tests print why and skip the compile
//! step, unless `NDFUSE_REQUIRE_NVRTC=1` (CI sets it), which turns a missing NVRTC into
//! a failure. Running the kernels needs a GPU: see `cuda_exec.rs`.

use ndfuse::{Context, DType, SliceArg, Tensor};
use ndfuse_codegen_cuda::{
    clear_memory_cache, compile, emit, nvrtc_version, CompileOptions, CudaError, CudaKernel,
    CudaOptions, Origin,
};
use ndfuse_ir::{Buffer, Expr, Kernel, Plan, Shape, Store, View};
use ndfuse_passes::TargetDesc;
use ndfuse_tests::catalogue::CATALOGUE;
use ndfuse_tests::hand_kernels::*;

/// Kernels of `outs` as the CUDA backend plans them, for no device in particular.
fn cuda_kernels(ctx: &Context, outs: &[Tensor]) -> Vec<CudaKernel> {
    cuda_kernels_for(ctx, outs, &CudaOptions::default())
}

/// Kernels of `outs` as the CUDA backend plans them, emitted under `opts`.
fn cuda_kernels_for(ctx: &Context, outs: &[Tensor], opts: &CudaOptions) -> Vec<CudaKernel> {
    let refs: Vec<&Tensor> = outs.iter().collect();
    let g = ctx.graph(&refs).expect("builds");
    let s = ndfuse_passes::schedule_for(&g, &TargetDesc::cuda());
    s.kernels()
        .map(|k| emit(k, opts).unwrap_or_else(|e| panic!("{e}")))
        .collect()
}

/// The options of an sm_80 device (A100): tensor cores for f16 and bf16.
const SM80: CudaOptions = CudaOptions {
    max_block_size: 256,
    max_grid_size: 4096,
    compute_capability: Some((8, 0)),
};

fn render(kernels: &[CudaKernel]) -> String {
    let mut s = String::new();
    for k in kernels {
        s.push_str(&format!(
            "==== {} ({} bytes of scratch)\n",
            k.name, k.scratch_bytes
        ));
        for l in &k.launches {
            s.push_str(&format!(
                "launch {}<<<{}, ({}, {})>>>\n",
                l.function, l.grid, l.block.0, l.block.1
            ));
        }
        s.push_str(&k.source);
    }
    s
}

fn zeros(ctx: &Context, shape: &[usize]) -> Tensor {
    let n = shape.iter().product();
    ctx.from_vec(vec![0.5f32; n], shape).expect("shape matches")
}

/// A constant input of `dtype` itself (not a cast, which a matmul could absorb).
fn filled(ctx: &Context, shape: &[usize], dtype: DType) -> Tensor {
    let n = shape.iter().product();
    match dtype {
        DType::F16 => ctx.from_vec(vec![half::f16::from_f32(0.5); n], shape),
        DType::BF16 => ctx.from_vec(vec![half::bf16::from_f32(0.5); n], shape),
        DType::F64 => ctx.from_vec(vec![0.5f64; n], shape),
        _ => ctx.from_vec(vec![0.5f32; n], shape),
    }
    .expect("shape matches")
}

/// Graphs that reach each strategy of the emitter (the catalogue's shapes are small).
fn strategies() -> Vec<(&'static str, Vec<Tensor>, Context)> {
    let ctx = Context::new();
    let h = ctx
        .from_vec(vec![half::f16::from_f32(0.5); 4096], &[4096])
        .expect("shape matches");
    let b = ctx
        .from_vec(vec![half::bf16::from_f32(0.5); 64 * 300], &[64, 300])
        .expect("shape matches");
    let v: Vec<(&'static str, Vec<Tensor>)> = vec![
        (
            "softmax_rows_4096_in_registers",
            vec![zeros(&ctx, &[64, 4096]).softmax(-1)],
        ),
        (
            "softmax_rows_40000_three_passes",
            vec![zeros(&ctx, &[4, 40000]).softmax(-1)],
        ),
        (
            "layernorm_rows_1024",
            vec![zeros(&ctx, &[32, 1024]).layernorm(-1, 1e-5)],
        ),
        ("full_sum_split", vec![zeros(&ctx, &[1 << 20]).sum(0)]),
        (
            "full_var_split_two_sweeps",
            vec![zeros(&ctx, &[1 << 16]).var(0)],
        ),
        (
            "argmax_long_rows_split",
            vec![zeros(&ctx, &[16, 50000]).argmax(1)],
        ),
        ("column_sum_tile", vec![zeros(&ctx, &[2048, 256]).sum(0)]),
        (
            "middle_axis_sum_tile",
            vec![zeros(&ctx, &[8, 64, 32]).sum(1)],
        ),
        (
            "outer_axes_sum_warp",
            vec![zeros(&ctx, &[8, 16, 32]).sum(vec![0i64, 2])],
        ),
        (
            "broadcast_vectorised",
            vec![&(&zeros(&ctx, &[256, 512]) * &zeros(&ctx, &[512])) + &zeros(&ctx, &[256, 1])],
        ),
        ("gelu_f16_vectorised", vec![h.gelu()]),
        ("bf16_softmax_rows", vec![b.softmax(-1)]),
        (
            "int_max_rows",
            vec![zeros(&ctx, &[64, 100]).cast(DType::I32).max(1)],
        ),
    ];
    v.into_iter().map(|(n, t)| (n, t, ctx.clone())).collect()
}

/// Matrix products: the tiled GEMM with its epilogue (`emit/gemm.rs`).
fn gemms() -> Vec<(&'static str, Vec<Tensor>, Context)> {
    let ctx = Context::new();
    let x = |shape: &[usize]| zeros(&ctx, shape);
    let h = |shape: &[usize]| {
        let n = shape.iter().product();
        ctx.from_vec(vec![half::f16::from_f32(0.5); n], shape)
            .expect("shape matches")
    };
    let v: Vec<(&'static str, Vec<Tensor>)> = vec![
        // Edges on M, N and K: every bounds check.
        (
            "matmul_f32_200x100x300",
            vec![x(&[200, 100]).matmul(&x(&[100, 300]))],
        ),
        // Tiles divide every extent: no bounds checks; bias and gelu in the epilogue.
        (
            "gelu_x_w_plus_b",
            vec![(&x(&[128, 512]).matmul(&x(&[512, 256])) + &x(&[256])).gelu()],
        ),
        // w [80, 64] transposed, broadcast over the batch of 4; f16 in and out.
        (
            "matmul_f16_batched_broadcast_transposed",
            vec![h(&[4, 100, 64]).matmul(&h(&[80, 64]).transpose())],
        ),
        // Operand prologues staged as they are read: an f32 lhs scaled then rounded to
        // bf16, a bf16 rhs divided by 3 (in bf16), for a bf16 product.
        (
            "matmul_prologues_scale_round_divide",
            vec![(&filled(&ctx, &[64, 96], DType::F32) * 0.125)
                .cast(DType::BF16)
                .matmul(&(&filled(&ctx, &[96, 48], DType::BF16) / 3.0))],
        ),
    ];
    v.into_iter().map(|(n, t)| (n, t, ctx.clone())).collect()
}

#[test]
fn every_gemm_has_its_cuda_c_pinned() {
    for (name, outs, ctx) in gemms() {
        let kernels = cuda_kernels(&ctx, &outs);
        assert_eq!(kernels.len(), 1, "{name}: one kernel, epilogue fused");
        assert!(
            kernels[0].strategy.starts_with("tiled GEMM"),
            "{name}: {}",
            kernels[0].strategy
        );
        insta::assert_snapshot!(format!("cuda_gemm_{name}"), render(&kernels));
    }
}

#[test]
fn every_gemm_compiles_with_nvrtc() {
    if !nvrtc_or_skip("every_gemm_compiles_with_nvrtc") {
        return;
    }
    for (name, outs, ctx) in gemms() {
        compile_all(&cuda_kernels(&ctx, &outs), name);
    }
}

/// `gelu(x @ w + b)` with half operands, for the tensor-core GEMM (`emit/gemm_wmma.rs`):
/// the operands' dtype, and whether it needs sm_80 (bf16) rather than sm_70.
fn wmma_gemms() -> Vec<(&'static str, Vec<Tensor>, Context, bool)> {
    let ctx = Context::new();
    let half = |shape: &[usize], dtype: DType| filled(&ctx, shape, dtype);
    let gelu = |x: &[usize], w: &[usize], dtype: DType| {
        let b = half(&[w[1]], dtype);
        (&half(x, dtype).matmul(&half(w, dtype)) + &b).gelu()
    };
    let x = half(&[100, 72], DType::BF16);
    let w = half(&[80, 72], DType::BF16);
    let t = (&x.matmul(&w.transpose()) + &half(&[80], DType::BF16)).gelu();
    let odd = half(&[65, 7], DType::F16)
        .transpose()
        .matmul(&half(&[65, 33], DType::F16));
    let rounded = half(&[64, 96], DType::F32)
        .cast(DType::F16)
        .matmul(&half(&[96, 48], DType::F32).cast(DType::F16));
    vec![
        // Tiles divide M, N and K: no guards; both operands in 16-byte copies.
        (
            "f16_gelu_x_w_plus_b",
            vec![gelu(&[256, 512], &[512, 128], DType::F16)],
            ctx.clone(),
            false,
        ),
        // x @ w.T, 100 x 72 x 80, as a linear layer stores w: guards on M and N, a zeroed
        // end of the K slice; b col-major (K inner), both in 16-byte copies.
        ("bf16_gelu_x_wt_plus_b_edges", vec![t], ctx.clone(), true),
        // x.T @ w, 7 x 33 x 65: odd sizes staged element by element, a col-major (M inner).
        ("f16_xt_w_odd_sizes", vec![odd], ctx.clone(), false),
        // f32 operands rounded to f16 as they are staged (their prologue), element by
        // element; 64 x 48 x 96.
        ("f16_rounded_from_f32", vec![rounded], ctx.clone(), false),
    ]
}

#[test]
fn every_wmma_gemm_has_its_cuda_c_pinned() {
    for (name, outs, ctx, _) in wmma_gemms() {
        let kernels = cuda_kernels_for(&ctx, &outs, &SM80);
        assert_eq!(kernels.len(), 1, "{name}: one kernel, epilogue fused");
        assert!(
            kernels[0]
                .strategy
                .starts_with("tiled GEMM on tensor cores"),
            "{name}: {}",
            kernels[0].strategy
        );
        insta::assert_snapshot!(format!("cuda_gemm_wmma_{name}"), render(&kernels));
    }
}

/// Tensor cores only where the device has them for the operands' dtype, never by
/// default, never for f32.
#[test]
fn tensor_cores_are_used_only_where_the_device_has_them() {
    let ctx = Context::new();
    let mm = |dtype: DType| filled(&ctx, &[32, 48], dtype).matmul(&filled(&ctx, &[48, 40], dtype));
    let cases = [
        (DType::F16, None, false),
        (DType::F16, Some((6, 1)), false),
        (DType::F16, Some((7, 0)), true),
        (DType::F16, Some((9, 0)), true),
        (DType::BF16, Some((7, 5)), false),
        (DType::BF16, Some((8, 0)), true),
        (DType::F32, Some((9, 0)), false),
        (DType::F64, Some((9, 0)), false),
    ];
    for (dtype, cc, wmma) in cases {
        let opts = CudaOptions {
            compute_capability: cc,
            ..CudaOptions::default()
        };
        let k = cuda_kernels_for(&ctx, &[mm(dtype)], &opts).remove(0);
        assert_eq!(
            k.source.contains("wmma::mma_sync"),
            wmma,
            "{dtype} on {cc:?}: {}",
            k.strategy
        );
        assert_eq!(k.strategy.contains("tensor cores"), wmma, "{}", k.strategy);
    }
}

#[test]
fn every_wmma_gemm_compiles_with_nvrtc() {
    if !nvrtc_or_skip("every_wmma_gemm_compiles_with_nvrtc") {
        return;
    }
    let dirs = ndfuse_codegen_cuda::include_dirs();
    assert!(
        dirs.iter().any(|d| d.join("crt").join("mma.h").is_file()),
        "no crt/mma.h in {dirs:?}: add the include directory of a CUDA toolkit, or of `pip install nvidia-cuda-nvcc-cu12`, to NDFUSE_CUDA_INCLUDE"
    );
    // sm_70 (f16 only: Volta has no bf16 fragments) where this NVRTC still targets it;
    // NVRTC 13 dropped it. sm_80 and sm_90 must always compile.
    let supported = ndfuse_codegen_cuda::nvrtc_supported_archs().expect("NVRTC's arch list");
    assert!(
        supported.contains(&80) && supported.contains(&90),
        "NVRTC targets {supported:?}: no sm_80 or sm_90"
    );
    if !supported.contains(&70) {
        eprintln!("every_wmma_gemm_compiles_with_nvrtc: this NVRTC has no sm_70 ({supported:?}): f16 on Volta not compiled");
    }
    for (name, outs, ctx, bf16) in wmma_gemms() {
        let kernels = cuda_kernels_for(&ctx, &outs, &SM80);
        let archs: &[(i32, i32)] = if bf16 {
            &[(8, 0), (9, 0)]
        } else {
            &[(7, 0), (8, 0), (9, 0)]
        };
        for &(major, minor) in archs
            .iter()
            .filter(|(major, minor)| supported.contains(&(major * 10 + minor)))
        {
            compile_with(
                &kernels,
                name,
                &CompileOptions::for_capability(major, minor),
            );
        }
    }
}

#[test]
fn every_catalogue_kernel_has_its_cuda_c_pinned() {
    for case in CATALOGUE {
        let ctx = Context::new();
        let outs = (case.build)(&ctx);
        let name = case.name.replace(|c: char| !c.is_ascii_alphanumeric(), "_");
        insta::assert_snapshot!(format!("cuda_{name}"), render(&cuda_kernels(&ctx, &outs)));
    }
}

#[test]
fn every_strategy_has_its_cuda_c_pinned() {
    for (name, outs, ctx) in strategies() {
        insta::assert_snapshot!(
            format!("cuda_strategy_{name}"),
            render(&cuda_kernels(&ctx, &outs))
        );
    }
}

#[test]
fn emission_is_deterministic() {
    for (_, outs, ctx) in strategies() {
        assert_eq!(
            render(&cuda_kernels(&ctx, &outs)),
            render(&cuda_kernels(&ctx, &outs))
        );
    }
}

/// Whether NVRTC can be used here; panics when it is required and missing.
fn nvrtc_or_skip(test: &str) -> bool {
    match nvrtc_version() {
        Ok(_) => true,
        Err(e) => {
            if std::env::var("NDFUSE_REQUIRE_NVRTC").is_ok_and(|v| v == "1") {
                panic!("NDFUSE_REQUIRE_NVRTC=1 but {e}");
            }
            eprintln!("{test}: skipped: {e}");
            false
        }
    }
}

fn compile_all(kernels: &[CudaKernel], what: &str) {
    compile_with(kernels, what, &CompileOptions::for_capability(9, 0));
}

fn compile_with(kernels: &[CudaKernel], what: &str, opts: &CompileOptions) {
    for k in kernels {
        if k.uses_half && opts.include_dirs.is_empty() {
            panic!(
                "{what}: {} uses f16/bf16 and no CUDA headers were found: set NDFUSE_CUDA_INCLUDE",
                k.name
            );
        }
        let c = compile(k, opts).unwrap_or_else(|e| panic!("{what} ({}): {e}", opts.arch));
        assert!(
            !c.image.is_empty(),
            "{what}: {} compiled to nothing",
            k.name
        );
    }
}

#[test]
fn every_catalogue_kernel_compiles_with_nvrtc() {
    if !nvrtc_or_skip("every_catalogue_kernel_compiles_with_nvrtc") {
        return;
    }
    for case in CATALOGUE {
        let ctx = Context::new();
        let outs = (case.build)(&ctx);
        compile_all(&cuda_kernels(&ctx, &outs), case.name);
    }
}

#[test]
fn every_strategy_compiles_with_nvrtc() {
    if !nvrtc_or_skip("every_strategy_compiles_with_nvrtc") {
        return;
    }
    for (name, outs, ctx) in strategies() {
        compile_all(&cuda_kernels(&ctx, &outs), name);
    }
}

/// A kernel no other test compiles (its constant is unique), so caches start cold.
fn unique_kernel(tag: f64) -> CudaKernel {
    let ctx = Context::new();
    let y = (zeros(&ctx, &[1000]) * tag).exp();
    cuda_kernels(&ctx, &[y]).remove(0)
}

#[test]
fn a_disk_cache_hit_loads_a_kernel_without_nvrtc_in_under_5_ms() {
    if !nvrtc_or_skip("a_disk_cache_hit_loads_a_kernel_without_nvrtc_in_under_5_ms") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("ndfuse-kcache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut opts = CompileOptions::for_capability(8, 0);
    opts.cache_dir = Some(dir.clone());
    let k = unique_kernel(1.234_567);
    let first = compile(&k, &opts).expect("compiles");
    assert_eq!(first.origin, Origin::Nvrtc);
    let files: Vec<String> = std::fs::read_dir(&dir)
        .expect("cache dir exists")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert!(files.iter().any(|f| f.ends_with(".cubin")), "{files:?}");
    assert!(files.iter().any(|f| f.ends_with(".cu")), "{files:?}");
    assert!(
        files
            .iter()
            .all(|f| f.contains("nvrtc") && f.contains("sm_80")),
        "named by NVRTC version and arch: {files:?}"
    );
    clear_memory_cache();
    let second = compile(&k, &opts).expect("loads");
    assert_eq!(second.origin, Origin::Disk);
    assert_eq!(second.image, first.image);
    assert!(
        second.millis < 5.0,
        "a disk hit took {:.3} ms (NVRTC took {:.3} ms)",
        second.millis,
        first.millis
    );
    eprintln!(
        "NVRTC compile {:.2} ms, disk-cache load {:.3} ms",
        first.millis, second.millis
    );
    // Another arch is another entry, never the sm_80 image.
    let mut other = opts.clone();
    other.arch = "sm_90".into();
    clear_memory_cache();
    let third = compile(&k, &other).expect("compiles");
    assert_eq!(third.origin, Origin::Nvrtc);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_nvrtc_error_carries_the_log_and_the_saved_source() {
    if !nvrtc_or_skip("an_nvrtc_error_carries_the_log_and_the_saved_source") {
        return;
    }
    let mut k = unique_kernel(7.654_321);
    k.source.push_str("\nthis is not CUDA;\n");
    let err = compile(&k, &CompileOptions::for_capability(9, 0)).expect_err("bad source");
    let CudaError::Compile {
        log, source_path, ..
    } = &err
    else {
        panic!("not a compile error: {err}");
    };
    assert!(log.contains("error"), "{log}");
    let saved = std::fs::read_to_string(source_path).expect("the source is saved");
    assert_eq!(saved, k.source);
    assert!(err.to_string().contains(&source_path.display().to_string()));
}

/// The contraction kernel of `out` (its only one).
fn product_kernel(ctx: &Context, out: &Tensor) -> ndfuse_ir::Kernel {
    let g = ctx.graph(&[out]).expect("builds");
    let s = ndfuse_passes::schedule_for(&g, &TargetDesc::cuda());
    let mut products: Vec<ndfuse_ir::Kernel> = s
        .kernels()
        .filter(|k| k.contraction.is_some())
        .cloned()
        .collect();
    assert_eq!(products.len(), 1, "one product kernel");
    products.remove(0)
}

/// Which products go to cuBLASLt on a GPU that has it, and how cuBLASLt reads them
/// (row-major `x @ w` as column-major `w^T x^T`): every operand layout with a unit stride
/// on a matrix axis, a collapsible batch, no prologue, f32/f16/bf16; the rest keep the
/// emitted GEMM. Bare products have cuBLASLt write the output; the others run their
/// epilogue as an element-wise kernel over an f32 product, which NVRTC compiles.
#[test]
fn cublaslt_takes_the_products_it_can_read() {
    let ctx = Context::new();
    // Arrays of `dtype` (a cast in the graph would be the product's prologue).
    let x = |shape: &[usize], dtype: DType| {
        let a = ctx
            .rand_normal(shape, 0.0, 1.0, shape.iter().sum::<usize>() as u64)
            .cast(dtype);
        ctx.from_array(&a.eval().expect("an operand"))
    };
    let f32_ = DType::F32;
    let call = |out: &Tensor| ndfuse_runtime::cublaslt_call(&product_kernel(&ctx, out));
    let cases: Vec<(&str, Tensor, Option<&str>)> = vec![
        (
            "x @ w",
            x(&[64, 32], f32_).matmul(&x(&[32, 48], f32_)),
            Some("cublasLtMatmul f32 -> f32: m 48, n 64, k 32, batch 1; A: N, ld 48; B: N, ld 32; D written directly"),
        ),
        (
            "x @ w.T",
            x(&[64, 32], f32_).matmul(&x(&[48, 32], f32_).transpose()),
            Some("cublasLtMatmul f32 -> f32: m 48, n 64, k 32, batch 1; A: T, ld 32; B: N, ld 32; D written directly"),
        ),
        (
            "x.T @ w",
            x(&[32, 64], f32_).transpose().matmul(&x(&[32, 48], f32_)),
            Some("cublasLtMatmul f32 -> f32: m 48, n 64, k 32, batch 1; A: N, ld 48; B: T, ld 64; D written directly"),
        ),
        (
            "a row slice of x @ w: an offset, the same leading dimension",
            x(&[70, 32], f32_)
                .slice(&[SliceArg::new(Some(3), Some(67), 1)])
                .matmul(&x(&[32, 48], f32_)),
            Some("cublasLtMatmul f32 -> f32: m 48, n 64, k 32, batch 1; A: N, ld 48; B: N, ld 32; D written directly"),
        ),
        (
            "bf16 x @ w: written directly, rounded once",
            x(&[64, 32], DType::BF16).matmul(&x(&[32, 48], DType::BF16)),
            Some("cublasLtMatmul bf16 -> bf16: m 48, n 64, k 32, batch 1; A: N, ld 48; B: N, ld 32; D written directly"),
        ),
        (
            "bf16 gelu(x @ w + b): cuBLASLt's GELU_BIAS",
            (&x(&[64, 32], DType::BF16).matmul(&x(&[32, 48], DType::BF16))
                + &x(&[48], DType::BF16))
                .gelu(),
            Some("cublasLtMatmul bf16 -> bf16: m 48, n 64, k 32, batch 1; A: N, ld 48; B: N, ld 32; D written directly, epilogue GELU_BIAS (in2)"),
        ),
        (
            "f32 relu(b + x @ w): RELU_BIAS",
            (&x(&[48], f32_) + &x(&[64, 32], f32_).matmul(&x(&[32, 48], f32_))).relu(),
            Some("cublasLtMatmul f32 -> f32: m 48, n 64, k 32, batch 1; A: N, ld 48; B: N, ld 32; D written directly, epilogue RELU_BIAS (in2)"),
        ),
        (
            "f32 x @ w + b: BIAS",
            &x(&[64, 32], f32_).matmul(&x(&[32, 48], f32_)) + &x(&[48], f32_),
            Some("cublasLtMatmul f32 -> f32: m 48, n 64, k 32, batch 1; A: N, ld 48; B: N, ld 32; D written directly, epilogue BIAS (in2)"),
        ),
        (
            "f16 gelu(x @ w): GELU",
            x(&[64, 32], DType::F16).matmul(&x(&[32, 48], DType::F16)).gelu(),
            Some("cublasLtMatmul f16 -> f16: m 48, n 64, k 32, batch 1; A: N, ld 48; B: N, ld 32; D written directly, epilogue GELU"),
        ),
        (
            "gelu(x @ w + c), c one value a row: the epilogue after",
            (&x(&[64, 32], f32_).matmul(&x(&[32, 48], f32_)) + &x(&[64, 1], f32_)).gelu(),
            Some("cublasLtMatmul f32 -> f32: m 48, n 64, k 32, batch 1; A: N, ld 48; B: N, ld 32; the epilogue as an element-wise kernel over D"),
        ),
        (
            "erf's gelu (another function): the epilogue after",
            x(&[64, 32], f32_).matmul(&x(&[32, 48], f32_)).gelu_erf(),
            Some("cublasLtMatmul f32 -> f32: m 48, n 64, k 32, batch 1; A: N, ld 48; B: N, ld 32; the epilogue as an element-wise kernel over D"),
        ),
        (
            "relu(x @ w) + r: the epilogue after",
            &x(&[64, 32], f32_).matmul(&x(&[32, 48], f32_)).relu() + &x(&[64, 48], f32_),
            Some("cublasLtMatmul f32 -> f32: m 48, n 64, k 32, batch 1; A: N, ld 48; B: N, ld 32; the epilogue as an element-wise kernel over D"),
        ),
        (
            "f16 x @ w cast to f32: the product's rounding to f16 first, in the epilogue",
            x(&[64, 32], DType::F16)
                .matmul(&x(&[32, 48], DType::F16))
                .cast(f32_),
            Some("cublasLtMatmul f16 -> f32: m 48, n 64, k 32, batch 1; A: N, ld 48; B: N, ld 32; the epilogue as an element-wise kernel over D"),
        ),
        (
            "batch of 5 @ w: the right operand broadcast",
            x(&[5, 33, 65], f32_).matmul(&x(&[65, 17], f32_)),
            Some("cublasLtMatmul f32 -> f32: m 17, n 33, k 65, batch 5; A: N, ld 17, batch stride 0; B: N, ld 65, batch stride 2145; D written directly"),
        ),
        (
            "batch 2x3 broadcast both ways: no single batch stride",
            x(&[2, 1, 7, 65], f32_).matmul(&x(&[3, 65, 17], f32_)),
            None,
        ),
        (
            "a prologue (x * 0.5 read as it is packed)",
            (&x(&[64, 32], DType::F16) * 0.5).matmul(&x(&[32, 48], DType::F16)),
            None,
        ),
        (
            "f64: the emitted GEMM",
            x(&[64, 32], DType::F64).matmul(&x(&[32, 48], DType::F64)),
            None,
        ),
        (
            "a column slice with stride 2: no unit stride",
            x(&[64, 64], f32_)
                .slice(&[SliceArg::all(), SliceArg::new(None, None, 2)])
                .matmul(&x(&[32, 48], f32_)),
            None,
        ),
    ];
    let mut wrong = Vec::new();
    for (name, out, want) in &cases {
        let got = call(out);
        if got.as_deref() != *want {
            wrong.push(format!("{name}:\n  got  {got:?}\n  want {want:?}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // The epilogue kernels compile.
    if nvrtc_or_skip("cublaslt_takes_the_products_it_can_read") {
        for (name, out, want) in &cases {
            if !want.is_some_and(|w| w.ends_with("element-wise kernel over D")) {
                continue;
            }
            let k = product_kernel(&ctx, out);
            let e = ndfuse_runtime::cublaslt_epilogue(&k).expect("an epilogue kernel");
            let ck = emit(&e, &CudaOptions::default()).expect("emits");
            assert!(!ck.strategy.contains("GEMM"), "{name}: {}", ck.strategy);
            compile_all(&[ck], name);
        }
    }
}

/// The product kernel of `x[7, 65] @ w[65, 80]` in `dtype`, with a gather in its
/// epilogue ([`with_gathered_epilogue`]).
fn gathered_product(dtype: DType) -> Kernel {
    let ctx = Context::new();
    let mm = filled(&ctx, &[7, 65], dtype).matmul(&filled(&ctx, &[65, 80], dtype));
    with_gathered_epilogue(product_kernel(&ctx, &mm))
}

#[test]
fn positions_and_gathers_have_their_cuda_c_pinned() {
    let opts = CudaOptions::default();
    let pinned = [
        ("pad_two_axis_gather_f32", pad_kernel(DType::F32)),
        (
            "gather_rows_i64_f16_vectorised",
            gather_rows_kernel(DType::F16, 9, 16, 12, true),
        ),
    ];
    for (name, k) in pinned {
        let ck = emit(&k, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            ck.source.contains("nd_gather_index("),
            "{name}: {}",
            ck.source
        );
        insta::assert_snapshot!(format!("cuda_{name}"), render(&[ck]));
    }
    // In an epilogue, on both GEMMs.
    for (dtype, opts) in [(DType::F32, CudaOptions::default()), (DType::F16, SM80)] {
        let ck = emit(&gathered_product(dtype), &opts).unwrap_or_else(|e| panic!("{e}"));
        assert!(ck.strategy.starts_with("tiled GEMM"), "{}", ck.strategy);
        assert_eq!(ck.source.contains("wmma::mma_sync"), dtype == DType::F16);
        assert!(
            ck.source.contains("(long long)(n)") && ck.source.contains("(nd_idx)nd_gather_index(v"),
            "{dtype}: {}",
            ck.source
        );
    }
}

/// Positions past 2^31 need 64-bit indices (the domain is small); a gather's offsets
/// stay in its buffer, so its indices never do, whatever their type.
#[test]
fn positions_past_2_31_index_in_64_bits() {
    let opts = CudaOptions::default();
    let far = position_kernel(DType::F64, &[4, 8], &[8, 1], 3_000_000_000);
    let near = position_kernel(DType::F64, &[4, 8], &[8, 1], 3_000);
    let src = |k: &Kernel| emit(k, &opts).expect("valid").source;
    assert!(src(&far).contains("typedef long long nd_idx;"));
    assert!(src(&far).contains("const nd_idx o0 = p + 3000000000;"));
    assert!(src(&near).contains("typedef int nd_idx;"));
    assert!(src(&gather_rows_kernel(DType::F32, 9, 16, 12, true)).contains("typedef int nd_idx;"));
}

/// The emitter computes positions and gathers in element-wise kernels and epilogues
/// only; in a row program it says so instead of emitting something wrong.
#[test]
fn a_position_in_a_kernel_with_reductions_is_refused() {
    let mut b = Body::default();
    let pos = b.push(
        DType::I64,
        Expr::Position {
            view: View::contiguous(Shape::new([4, 8])),
        },
    );
    let sum = b.push(DType::I64, Expr::Reduce(ndfuse_ir::Accumulate::Sum, pos));
    let k = Kernel {
        name: "k0_position_sum".into(),
        domain: Shape::new([4, 8]),
        reduce_axes: vec![1],
        inputs: vec![],
        outputs: vec![Buffer {
            dtype: DType::I64,
            len: 4,
        }],
        body: b.0,
        stores: vec![Store {
            value: sum,
            output: 0,
        }],
        plan: Plan::Rows {
            rows: 4,
            row_len: 8,
            contiguous: true,
        },
        plan_reason: "rows".into(),
        contraction: None,
    };
    assert_eq!(k.check(), Ok(()));
    let e = emit(&k, &CudaOptions::default()).expect_err("refused");
    assert!(
        e.to_string()
            .contains("a position in a kernel with reduce axes"),
        "{e}"
    );
}

#[test]
fn positions_and_gathers_compile_with_nvrtc() {
    if !nvrtc_or_skip("positions_and_gathers_compile_with_nvrtc") {
        return;
    }
    let opts = CudaOptions::default();
    for dtype in [DType::F32, DType::F16, DType::F64] {
        for (what, k) in position_and_gather_kernels(dtype) {
            compile_all(&[emit(&k, &opts).unwrap_or_else(|e| panic!("{e}"))], &what);
        }
    }
    let far = position_kernel(DType::F32, &[4, 8], &[8, 1], 3_000_000_000);
    compile_all(&[emit(&far, &opts).expect("valid")], "positions past 2^31");
    for (dtype, opts) in [
        (DType::F32, CudaOptions::default()),
        (DType::F64, CudaOptions::default()),
        (DType::F16, SM80),
    ] {
        let k = emit(&gathered_product(dtype), &opts).unwrap_or_else(|e| panic!("{e}"));
        compile_with(
            &[k],
            &format!("{dtype} product with a gather in its epilogue"),
            &CompileOptions::for_capability(8, 0),
        );
    }
}

// ---------------------------------------------------------------------------------------
// Routines: scatter-add, scans and argsort (`emit_routine`).
// ---------------------------------------------------------------------------------------

/// `op` on inputs of these (dtype, shape), emitted as a routine under `opts`.
fn routine(
    op: ndfuse_ir::Op,
    inputs: &[(DType, &[usize])],
    opts: &CudaOptions,
) -> ndfuse_codegen_cuda::RoutineCode {
    let mut g = ndfuse_ir::Graph::new();
    let ids: Vec<_> = inputs
        .iter()
        .enumerate()
        .map(|(i, &(d, s))| g.add_input(format!("in{i}"), d, Shape::new(s.to_vec())))
        .collect();
    let n = g.add(op, &ids).expect("a valid routine");
    let types: Vec<_> = ids.iter().map(|&i| g.ty(i)).collect();
    ndfuse_codegen_cuda::emit_routine(g.node(n), &types, opts).expect("emits")
}

fn routine_kernel(op: ndfuse_ir::Op, inputs: &[(DType, &[usize])]) -> CudaKernel {
    match routine(op, inputs, &CudaOptions::default()) {
        ndfuse_codegen_cuda::RoutineCode::Kernel(k) => k,
        ndfuse_codegen_cuda::RoutineCode::Host(why) => panic!("no kernel: {why}"),
    }
}

/// Every routine kernel variant: each dtype the op takes, each strategy.
fn routine_kernels() -> Vec<CudaKernel> {
    use ndfuse_ir::{Op, ScanOp};
    let floats_and_ints = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::I64,
    ];
    let mut ks = Vec::new();
    for d in floats_and_ints {
        for idx in [DType::I32, DType::I64] {
            ks.push(routine_kernel(
                Op::ScatterAdd { axis: 1 },
                &[(d, &[8, 50, 16]), (idx, &[8, 70, 16]), (d, &[8, 70, 16])],
            ));
        }
        for op in [ScanOp::Sum, ScanOp::Prod] {
            for (shape, axis) in [
                (&[8usize, 5000][..], 1),
                (&[9, 40][..], 1),
                (&[2, 80, 1024][..], 1),
            ] {
                for reverse in [false, true] {
                    ks.push(routine_kernel(
                        Op::Scan { op, axis, reverse },
                        &[(d, shape)],
                    ));
                }
            }
        }
    }
    for d in floats_and_ints.into_iter().chain([DType::Bool]) {
        for (shape, axis, k) in [(&[64usize, 2048][..], 1, 2048), (&[5, 300, 7][..], 1, 10)] {
            for descending in [false, true] {
                ks.push(routine_kernel(
                    Op::Argsort {
                        axis,
                        descending,
                        k,
                    },
                    &[(d, shape)],
                ));
            }
        }
    }
    ks
}

/// An attention node (`backward`: its gradient) over `q [B, Hq, Tq, D]`, `k`, `v
/// [B, Hkv, Tk, D|Dv]` of `dtype` (in `spec`'s layout), with the extras `spec` asks for:
/// an f32 bias `[1, Hq, 1, Tk]`, key lengths, a dropout key.
fn attention_kernel(
    spec: ndfuse_ir::AttentionSpec,
    backward: bool,
    dtype: DType,
    [b, hq, hkv, tq, tk, d, dv]: [usize; 7],
) -> CudaKernel {
    let l = spec.layout;
    let (qs, ks, vs) = (
        l.shape(b, hq, tq, d),
        l.shape(b, hkv, tk, d),
        l.shape(b, hkv, tk, dv),
    );
    let os = l.shape(b, hq, tq, dv);
    let qkv = [b, tq, (hq + 2 * hkv) * d];
    let mut inputs: Vec<(DType, &[usize])> = match l {
        ndfuse_ir::AttentionLayout::Packed { .. } => vec![(dtype, &qkv)],
        _ => vec![(dtype, &qs), (dtype, &ks), (dtype, &vs)],
    };
    if backward {
        inputs.extend([(dtype, &os[..]), (dtype, &os[..])]);
    }
    let bias = [1, hq, 1, tk];
    let lens = [b];
    if spec.bias {
        inputs.push((DType::F32, &bias));
    }
    if spec.key_lengths {
        inputs.push((DType::I64, &lens));
    }
    if spec.dropout.is_some() {
        inputs.push((DType::I64, &[]));
    }
    let op = if backward {
        ndfuse_ir::Op::AttentionBackward(spec)
    } else {
        ndfuse_ir::Op::Attention(spec)
    };
    routine_kernel(op, &inputs)
}

/// Attention's spec: `causal`, scale `1 / sqrt(d)`, all the extras when `extras`.
fn attention_spec(
    causal: ndfuse_ir::CausalMask,
    layout: ndfuse_ir::AttentionLayout,
    d: usize,
    extras: bool,
) -> ndfuse_ir::AttentionSpec {
    ndfuse_ir::AttentionSpec {
        layout,
        causal,
        scale: ndfuse_ir::Scalar::F(1.0 / (d as f64).sqrt()),
        bias: extras,
        key_lengths: extras,
        dropout: extras.then_some(ndfuse_ir::Scalar::F(0.1)),
    }
}

/// Every attention variant: each float dtype, forward and backward, with and without
/// the extras, each layout, narrow and the widest heads.
fn attention_kernels() -> Vec<CudaKernel> {
    use ndfuse_ir::{AttentionLayout as L, CausalMask as M};
    let mut ks = Vec::new();
    for d in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        for backward in [false, true] {
            ks.push(attention_kernel(
                attention_spec(M::TopLeft, L::Bhtd, 64, true),
                backward,
                d,
                [2, 8, 2, 300, 500, 64, 64],
            ));
            ks.push(attention_kernel(
                attention_spec(M::BottomRight, L::Bthd, 16, false),
                backward,
                d,
                [1, 4, 4, 7, 130, 16, 32],
            ));
        }
    }
    for backward in [false, true] {
        let packed = L::Packed {
            q_heads: 12,
            kv_heads: 4,
        };
        ks.push(attention_kernel(
            attention_spec(M::TopLeft, packed, 64, true),
            backward,
            DType::BF16,
            [2, 12, 4, 256, 256, 64, 64],
        ));
        ks.push(attention_kernel(
            attention_spec(M::None, L::Bhtd, 256, true),
            backward,
            DType::F64,
            [1, 2, 1, 40, 40, 256, 256],
        ));
    }
    ks
}

#[test]
fn attention_routines_have_their_cuda_c_pinned() {
    use ndfuse_ir::{AttentionLayout as L, CausalMask as M};
    let kernels = vec![
        attention_kernel(
            attention_spec(M::TopLeft, L::Bhtd, 64, true),
            false,
            DType::F32,
            [2, 8, 2, 300, 500, 64, 64],
        ),
        attention_kernel(
            attention_spec(M::BottomRight, L::Bthd, 16, false),
            true,
            DType::F16,
            [1, 4, 2, 7, 130, 16, 32],
        ),
    ];
    insta::assert_snapshot!("cuda_attention", render(&kernels));
}

#[test]
fn attention_emission_is_deterministic_and_wide_heads_go_to_the_host() {
    assert_eq!(render(&attention_kernels()), render(&attention_kernels()));
    let spec = attention_spec(
        ndfuse_ir::CausalMask::None,
        ndfuse_ir::AttentionLayout::Bhtd,
        512,
        false,
    );
    let wide = routine(
        ndfuse_ir::Op::Attention(spec),
        &[
            (DType::F32, &[1, 2, 16, 512]),
            (DType::F32, &[1, 2, 16, 512]),
            (DType::F32, &[1, 2, 16, 64]),
        ],
        &CudaOptions::default(),
    );
    assert!(
        matches!(&wide, ndfuse_codegen_cuda::RoutineCode::Host(why) if why.contains("512")),
        "{wide:?}"
    );
}

#[test]
fn attention_routines_compile_with_nvrtc() {
    if !nvrtc_or_skip("attention_routines_compile_with_nvrtc") {
        return;
    }
    compile_all(&attention_kernels(), "attention routines");
}

#[test]
fn routines_have_their_cuda_c_pinned() {
    use ndfuse_ir::{Op, ScanOp};
    let kernels = vec![
        routine_kernel(
            Op::ScatterAdd { axis: 1 },
            &[
                (DType::F16, &[8, 50, 16]),
                (DType::I64, &[8, 70, 16]),
                (DType::F16, &[8, 70, 16]),
            ],
        ),
        routine_kernel(
            Op::Scan {
                op: ScanOp::Sum,
                axis: 1,
                reverse: true,
            },
            &[(DType::F32, &[8, 5000])],
        ),
        routine_kernel(
            Op::Argsort {
                axis: 1,
                descending: true,
                k: 10,
            },
            &[(DType::F32, &[5, 300, 7])],
        ),
    ];
    insta::assert_snapshot!("cuda_routines", render(&kernels));
}

#[test]
fn routine_emission_is_deterministic_and_long_sorts_go_to_the_host() {
    assert_eq!(render(&routine_kernels()), render(&routine_kernels()));
    let long = routine(
        ndfuse_ir::Op::Argsort {
            axis: 0,
            descending: false,
            k: 5000,
        },
        &[(DType::F32, &[5000])],
        &CudaOptions::default(),
    );
    assert!(
        matches!(&long, ndfuse_codegen_cuda::RoutineCode::Host(why) if why.contains("5000")),
        "{long:?}"
    );
}

#[test]
fn routines_compile_with_nvrtc() {
    if !nvrtc_or_skip("routines_compile_with_nvrtc") {
        return;
    }
    compile_all(&routine_kernels(), "routines");
}
