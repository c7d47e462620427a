//! Element-wise kernels on the wide path (`blocks`: JIT segments and wide routines on
//! L1 blocks) against the same kernels compiled whole on the 128-bit code: the same
//! bits for every output, on f32, f16 and bf16, for kernels shaped like gelu, like an
//! exp chain, with values stored from the middle of the kernel, with several outputs,
//! with a wide op read straight from an input and stored straight to an output, with
//! f32 values rounded into f16 and bf16 outputs (a half product's epilogue), with
//! gelu's tail as one wide step, and at
//! lengths that end in a partial block and a partial register; on 1, 2 and 4 threads.
//! Tolerance: the same bits (two NaNs count as equal whatever their payload: neither
//! path defines the payload of a NaN that arithmetic makes).

mod builder;
mod paths;

use builder::{zeroed_outputs, KernelBuilder};
use ndfuse_codegen_cpu::compile_with;
use ndfuse_codegen_cpu::wide;
use ndfuse_ir::{BinaryOp, DType, HostArray, Kernel, Scalar, Shape, UnaryOp};
use paths::{bits, run_on, tiers};

/// Enough positions for the wide path (kernels below 2^16 compile whole), and not a
/// multiple of a block or a register.
const N: usize = (1 << 17) + 1000 + 7;

/// Inputs of `kernel` (see `paths::inputs`).
fn inputs(kernel: &Kernel) -> Vec<HostArray> {
    paths::inputs(kernel, 0x2545_F491_4F6C_DD1D, 997)
}

/// `kernel` on the wide path equals it compiled whole, and really took the wide path.
fn check(kernel: &Kernel, expect_blocks: bool) {
    check_on(kernel, &inputs(kernel), expect_blocks)
}

/// [`check`] on the inputs `ins`.
fn check_on(kernel: &Kernel, ins: &[HostArray], expect_blocks: bool) {
    let whole = compile_with(kernel, None).expect("compiles whole");
    assert!(!whole.clif().contains("; blocks of"), "None compiles whole");
    let want: Vec<Vec<u64>> = run_on(&whole, kernel, ins, 2).iter().map(bits).collect();
    for tier in tiers() {
        let ck = compile_with(kernel, Some(tier)).expect("compiles on the wide path");
        assert_eq!(
            ck.clif().contains("; blocks of"),
            expect_blocks,
            "{}: wide path taken?\n{}",
            kernel.name,
            ck.clif().lines().take(12).collect::<Vec<_>>().join("\n")
        );
        for threads in [1, 2, 4] {
            let got = run_on(&ck, kernel, ins, threads);
            for (o, (g, w)) in got.iter().map(bits).zip(&want).enumerate() {
                if let Some(i) = (0..g.len()).find(|&i| g[i] != w[i]) {
                    panic!(
                        "{} ({}, {threads} threads) output {o} position {i}: {} against {} whole",
                        kernel.name,
                        tier.name(),
                        got[o].storage().get_f64(i),
                        f64::from_bits(w[i])
                    );
                }
            }
        }
    }
}

/// gelu as the passes build it, x · sigmoid(1.5957 · (x + 0.0447 · x³)), with
/// constants every float type holds exactly.
fn gelu(dtype: DType) -> Kernel {
    let mut k = KernelBuilder::new(&format!("k_gelu_{dtype}"), &[N]);
    let x = k.load(dtype);
    let sq = k.unary(UnaryOp::Square, x);
    let cube = k.binary(BinaryOp::Mul, x, sq);
    let c1 = k.constant(dtype, Scalar::F(0.046_875));
    let t = k.binary(BinaryOp::Mul, cube, c1);
    let inner = k.binary(BinaryOp::Add, x, t);
    let c2 = k.constant(dtype, Scalar::F(1.593_75));
    let z = k.binary(BinaryOp::Mul, inner, c2);
    let s = k.unary(UnaryOp::Sigmoid, z);
    let y = k.binary(BinaryOp::Mul, x, s);
    k.store(y);
    k.build()
}

#[test]
fn gelu_on_every_float_type_matches_the_whole_kernel() {
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        // f32 takes the wide path once the math routines exist; halves always do.
        let f32_wide = wide::available()
            .first()
            .is_some_and(|&t| wide::unary(UnaryOp::Sigmoid, t, &[0.0], &mut [0.0]));
        check(&gelu(dtype), dtype != DType::F32 || f32_wide);
    }
}

/// The wide gelu step takes its fast path on -|z| clamped to -86.9 where every lane
/// of a register has e^z normal or rounding to 0 (and some lane has |z| ≥ 87), and
/// the general one where some lane is in the band between: every f32 whose z reaches
/// that band and its edges (x in ±[9.8, 11.5]; z = -87 at x = -10.13 and -104.2 at
/// -10.8), consecutive, each beside ±12 (|z| > 87, outside the band), so that
/// registers lie on either side of each edge and across it, and none takes the
/// unclamped fast path.
#[test]
fn gelu_across_the_subnormal_band_matches_the_whole_kernel() {
    let from = 9.8f32.to_bits();
    let to = 11.5f32.to_bits();
    let vals: Vec<f64> = [-1.0f32, 1.0]
        .into_iter()
        .flat_map(|sign| (from..to).flat_map(move |b| [sign * f32::from_bits(b), -sign * 12.0]))
        .map(f64::from)
        .collect();
    let mut k = gelu(DType::F32);
    k.domain = Shape::new([vals.len()]);
    k.inputs[0].len = vals.len();
    k.outputs[0].len = vals.len();
    if let ndfuse_ir::Expr::Load { view, .. } = &mut k.body[0].expr {
        *view = ndfuse_ir::View::contiguous(Shape::new([vals.len()]));
    }
    let ins = [HostArray::from_f64s(
        DType::F32,
        Shape::new([vals.len()]),
        &vals,
    )];
    check_on(&k, &ins, !wide::available().is_empty());
}

/// gelu's tail in an f32 kernel is one wide step (`blocks::Step::Gelu`): in the order
/// the passes emit it and with every operand pair swapped, from an input straight to
/// the output or between segments (a scale after); with a bias broadcast over rows
/// added first, the add is the step's too (`blocks::Step::GeluSum`, called once per
/// run of a block inside a row); the same bits as the kernel compiled whole. A stored
/// intermediate keeps the instructions apart.
#[test]
fn gelu_tails_are_one_wide_step_with_the_same_bits() {
    if wide::available().is_empty() {
        println!("skipped: no wide tier on this host");
        return;
    }
    let build = |swapped: bool, bias: bool, store_cube: bool| {
        let mut k = KernelBuilder::new(
            &format!("k_gelu_tail_{swapped}_{bias}_{store_cube}"),
            &[131, 1000],
        );
        let p = k.load(DType::F32);
        let x = if bias {
            // A row of 1000 from offset 3 of 1003, broadcast over the rows; the rows
            // end inside blocks.
            let b = k.load_view(DType::F32, 1003, builder::view(&[131, 1000], &[0, 1], 3));
            if swapped {
                k.binary(BinaryOp::Add, b, p)
            } else {
                k.binary(BinaryOp::Add, p, b)
            }
        } else {
            p
        };
        let pair = |a, b| if swapped { (b, a) } else { (a, b) };
        let sq = k.unary(UnaryOp::Square, x);
        let (a, b) = pair(x, sq);
        let cube = k.binary(BinaryOp::Mul, a, b);
        let c1 = k.constant(DType::F32, Scalar::F(f64::from(0.044_715f32)));
        let (a, b) = pair(cube, c1);
        let t = k.binary(BinaryOp::Mul, a, b);
        let (a, b) = pair(x, t);
        let inner = k.binary(BinaryOp::Add, a, b);
        let c2 = k.constant(DType::F32, Scalar::F(f64::from(1.595_769_2f32)));
        let (a, b) = pair(inner, c2);
        let z = k.binary(BinaryOp::Mul, a, b);
        let s = k.unary(UnaryOp::Sigmoid, z);
        let (a, b) = pair(x, s);
        let y = k.binary(BinaryOp::Mul, a, b);
        let y = if bias {
            let h = k.constant(DType::F32, Scalar::F(0.5));
            k.binary(BinaryOp::Mul, y, h)
        } else {
            y
        };
        k.store(y);
        if store_cube {
            k.store(cube);
        }
        k.build()
    };
    for swapped in [false, true] {
        for bias in [false, true] {
            for store_cube in [false, true] {
                let kernel = build(swapped, bias, store_cube);
                check(&kernel, true);
                for tier in tiers() {
                    let ck = compile_with(&kernel, Some(tier)).expect("compiles");
                    let clif = ck.clif();
                    let head = clif.lines().take(8).collect::<Vec<_>>().join("\n");
                    assert_eq!(
                        clif.contains("gelu x * sigmoid"),
                        !store_cube,
                        "{} on {}:\n{head}",
                        kernel.name,
                        tier.name(),
                    );
                    // The bias add is the step's too (`Step::GeluSum`).
                    assert_eq!(
                        clif.contains("x = in0 + in1[3 + position % 1000]"),
                        bias && !store_cube,
                        "{} on {}:\n{head}",
                        kernel.name,
                        tier.name(),
                    );
                }
            }
        }
    }
}

#[test]
fn stores_from_the_middle_and_several_outputs_match() {
    for dtype in [DType::F32, DType::F16] {
        let mut k = KernelBuilder::new(&format!("k_chain_{dtype}"), &[N]);
        let a = k.load(dtype);
        let b = k.load(dtype);
        let c = k.load(dtype);
        let ab = k.binary(BinaryOp::Mul, a, b);
        let abc = k.binary(BinaryOp::Add, ab, c);
        let e = k.unary(UnaryOp::Exp, abc);
        let r = k.unary(UnaryOp::Abs, a);
        let r = k.unary(UnaryOp::Sqrt, r);
        let er = k.binary(BinaryOp::Mul, e, r);
        let t = k.unary(UnaryOp::Tanh, er);
        let d = k.binary(BinaryOp::Sub, t, b);
        k.store(d);
        k.store(ab); // computed in the first segment
        k.store(e); // a wide op's value, also read later
        k.store(c); // an input, stored as it is
        check(
            &k.build(),
            dtype != DType::F32 || !wide::available().is_empty(),
        );
    }
}

#[test]
fn a_wide_op_from_an_input_to_an_output_matches() {
    for dtype in [DType::F32, DType::BF16] {
        let mut k = KernelBuilder::new(&format!("k_exp_{dtype}"), &[N]);
        let x = k.load(dtype);
        let e = k.unary(UnaryOp::Exp, x);
        k.store(e);
        let kernel = k.build();
        let has_exp = wide::available()
            .first()
            .is_some_and(|&t| wide::unary(UnaryOp::Exp, t, &[0.0], &mut [0.0]));
        check(&kernel, dtype != DType::F32 || has_exp);
    }
}

#[test]
fn broadcast_f32_loads_are_read_through_their_views() {
    // sigmoid(a[R, C] * b[C] + c[R, 1]): the row loop's loads, in segments that keep
    // the kernel's 2-d domain; rows of 1000 so blocks cross rows.
    let (r, c) = (131, 1000);
    let mut k = KernelBuilder::new("k_bcast", &[r, c]);
    let a = k.load(DType::F32);
    let b = k.load_view(DType::F32, c, builder::view(&[r, c], &[0, 1], 0));
    let cc = k.load_view(DType::F32, r, builder::view(&[r, c], &[1, 0], 0));
    let ab = k.binary(BinaryOp::Mul, a, b);
    let z = k.binary(BinaryOp::Add, ab, cc);
    let s = k.unary(UnaryOp::Sigmoid, z);
    let y = k.binary(BinaryOp::Mul, s, b);
    k.store(y);
    check(&k.build(), !wide::available().is_empty());
}

#[test]
fn f32_kernels_rounding_their_stores_to_halves_match() {
    // A half matrix product's epilogues: cast(p, f16) alone (nothing but the
    // conversion for the wide routines), and a gelu-like f32 chain stored rounded to
    // bf16 and to f16 and also whole in f32; both read a 2-d f32 input with a
    // broadcast bias, as the product's epilogue does.
    let (r, c) = (131, 1000);
    for (name, with_math) in [("k_cast_only", false), ("k_sigmoid_cast", true)] {
        let mut k = KernelBuilder::new(name, &[r, c]);
        let p = k.load(DType::F32);
        let b = k.load_view(DType::F32, c, builder::view(&[r, c], &[0, 1], 0));
        if with_math {
            let z = k.binary(BinaryOp::Add, p, b);
            let s = k.unary(UnaryOp::Sigmoid, z);
            let y = k.binary(BinaryOp::Mul, z, s);
            let h = k.cast(y, DType::BF16);
            k.store(h);
            let h = k.cast(y, DType::F16);
            k.store(h);
            k.store(y);
        } else {
            let h = k.cast(p, DType::F16);
            k.store(h);
        }
        check(&k.build(), !wide::available().is_empty());
    }
    // A cast another instruction reads is not a store's conversion: compiled whole.
    let mut k = KernelBuilder::new("k_cast_used", &[N]);
    let x = k.load(DType::F32);
    let h = k.cast(x, DType::F16);
    let e = k.unary(UnaryOp::Exp, h);
    k.store(e);
    check(&k.build(), false);
}

#[test]
fn small_and_plain_kernels_compile_whole() {
    let unary = |name: &str, n: usize, dtype: DType, op: UnaryOp| {
        let mut k = KernelBuilder::new(name, &[n]);
        let x = k.load(dtype);
        let y = k.unary(op, x);
        k.store(y);
        k.build()
    };
    // Below 2^16 positions an f32 kernel compiles whole, below one block (512) a half
    // one; from one block on, a half kernel takes blocks (the routines convert it).
    check(&unary("k_small", 4096, DType::F32, UnaryOp::Sigmoid), false);
    check(
        &unary("k_small_f16", 511, DType::F16, UnaryOp::Sigmoid),
        false,
    );
    check(
        &unary("k_half_block", 512, DType::F16, UnaryOp::Sigmoid),
        true,
    );
    check(&unary("k_half_4096", 4096, DType::BF16, UnaryOp::Abs), true);
    // An f32 kernel with nothing for the wide routines.
    let mut k = KernelBuilder::new("k_plain", &[N]);
    let x = k.load(DType::F32);
    let y = k.binary(BinaryOp::Mul, x, x);
    k.store(y);
    check(&k.build(), false);
}

/// This thread's time on a CPU, in ns (Linux's schedstat): robust to the other work of
/// a shared machine, which only delays the thread.
fn thread_cpu_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

/// Prints the CPU time of one thread running each kernel whole and on the wide path
/// (best of 5 over 2^24 positions): `cargo test --release --test wide_blocks --
/// --ignored --nocapture`. A measurement, not a check.
#[test]
#[ignore]
fn timing() {
    const M: usize = 1 << 24;
    let chain = {
        let mut k = KernelBuilder::new("k_chain", &[M]);
        let (a, b, c) = (k.load(DType::F32), k.load(DType::F32), k.load(DType::F32));
        let ab = k.binary(BinaryOp::Mul, a, b);
        let abc = k.binary(BinaryOp::Add, ab, c);
        let e = k.unary(UnaryOp::Exp, abc);
        let r = k.unary(UnaryOp::Abs, a);
        let r = k.unary(UnaryOp::Sqrt, r);
        let er = k.binary(BinaryOp::Mul, e, r);
        let one = k.constant(DType::F32, Scalar::F(1.0));
        let cc = k.binary(BinaryOp::Mul, c, c);
        let den = k.binary(BinaryOp::Add, one, cc);
        let q = k.binary(BinaryOp::Div, b, den);
        let y = k.binary(BinaryOp::Sub, er, q);
        k.store(y);
        k.build()
    };
    let gelu = |dtype| {
        let mut k = gelu(dtype);
        k.domain = Shape::new([M]);
        k.inputs[0].len = M;
        k.outputs[0].len = M;
        if let ndfuse_ir::Expr::Load { view, .. } = &mut k.body[0].expr {
            *view = ndfuse_ir::View::contiguous(Shape::new([M]));
        }
        k
    };
    for kernel in [chain, gelu(DType::F32), gelu(DType::F16)] {
        let ins = inputs(&kernel);
        let refs: Vec<&HostArray> = ins.iter().collect();
        let mut line = format!("{:>12}", kernel.name);
        for tier in std::iter::once(None).chain(wide::available().into_iter().map(Some)) {
            let ck = compile_with(&kernel, tier).expect("compiles");
            let mut outs = zeroed_outputs(&kernel);
            let mut best = u64::MAX;
            for _ in 0..5 {
                let mut out_refs: Vec<&mut HostArray> = outs.iter_mut().collect();
                let t0 = thread_cpu_ns().unwrap_or(0);
                ck.run_range(&refs, &mut out_refs, 0, M).expect("runs");
                best = best.min(thread_cpu_ns().unwrap_or(0) - t0);
            }
            let name = tier.map_or("128-bit", |t| t.name());
            line.push_str(&format!("  {name}: {:.2} ns/elem", best as f64 / M as f64));
        }
        println!("{line}");
    }
}

#[test]
fn the_wide_path_counts_the_operations_the_128_bit_code_would_run() {
    // A wide op or conversion counts as the 128-bit code that would do it, so the
    // count of a kernel is about the same on either path (its segments add the loads
    // and stores of scratch slots).
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let k = gelu(dtype);
        let whole = compile_with(&k, None).expect("compiles").ops_per_element();
        let whole = whole.expect("counted");
        for tier in tiers() {
            let wide = compile_with(&k, Some(tier))
                .expect("compiles")
                .ops_per_element();
            let wide = wide.expect("counted");
            eprintln!(
                "gelu {dtype}: {whole:.1} ops/elem whole, {wide:.1} on {}",
                tier.name()
            );
            assert!(
                wide >= 0.8 * whole && wide <= 1.6 * whole,
                "gelu {dtype}: {wide} ops/elem on {} against {whole} whole",
                tier.name()
            );
        }
    }
}
