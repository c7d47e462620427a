//! The random op (`Expr::Random`) compiled: bit-identical to the interpreter and to
//! `ndfuse_ir::op::random_uniform` at the op's own positions, for domains of 1, 7, 1000
//! and 4096x33 positions (vector tails), on pools of 1, 2 and 4 threads, read
//! contiguously and through a transpose, a broadcast and a slice, fused with a
//! multiply-add; positions past 2^32 take the key schedule of their high half; and a
//! kernel with reduce axes is refused (the interpreter runs it); dropout's kernel runs on
//! i32x4 lanes (the hash) and lane masks (the select), NaN and infinities included.

use ndfuse_codegen_cpu::{compile, supports};
use ndfuse_ir::interp::eval_kernel;
use ndfuse_ir::op::random_uniform;
use ndfuse_ir::{
    Accumulate, BinaryOp, Buffer, DType, Expr, HostArray, Instr, Kernel, Plan, Shape, Storage,
    Store, ValueId, View,
};

fn key_array(key: i64) -> HostArray {
    HostArray::new(Shape::scalar(), Storage::from_i64s(DType::I64, &[key])).expect("one element")
}

/// The key's load: its one element at every position of `domain`.
fn key_load(domain: &Shape) -> Instr {
    Instr {
        dtype: DType::I64,
        expr: Expr::Load {
            input: 0,
            view: View {
                shape: domain.clone(),
                strides: vec![0; domain.rank()],
                offset: 0,
            },
        },
    }
}

/// `random(key) through view * x + y` over `domain` (`x` and `y` contiguous f32
/// inputs 1 and 2) when `fma`, else the random values alone.
fn kernel(domain: &[usize], view: View, fma: bool) -> Kernel {
    let domain = Shape::new(domain);
    let n = domain.numel();
    let f32s = |len| Buffer {
        dtype: DType::F32,
        len,
    };
    let mut body = vec![
        key_load(&domain),
        Instr {
            dtype: DType::F32,
            expr: Expr::Random {
                key: ValueId(0),
                view,
            },
        },
    ];
    let mut inputs = vec![Buffer {
        dtype: DType::I64,
        len: 1,
    }];
    let mut out = ValueId(1);
    if fma {
        let load = |input| Instr {
            dtype: DType::F32,
            expr: Expr::Load {
                input,
                view: View::contiguous(domain.clone()),
            },
        };
        body.push(load(1));
        body.push(load(2));
        body.push(Instr {
            dtype: DType::F32,
            expr: Expr::Binary(BinaryOp::Mul, ValueId(1), ValueId(2)),
        });
        body.push(Instr {
            dtype: DType::F32,
            expr: Expr::Binary(BinaryOp::Add, ValueId(4), ValueId(3)),
        });
        inputs.extend([f32s(n), f32s(n)]);
        out = ValueId(5);
    }
    let k = Kernel {
        name: "k0_random_uniform".into(),
        domain,
        reduce_axes: vec![],
        inputs,
        outputs: vec![f32s(n)],
        body,
        stores: vec![Store {
            value: out,
            output: 0,
        }],
        plan: Plan::Elementwise,
        plan_reason: "test".into(),
        contraction: None,
    };
    k.check().unwrap_or_else(|e| panic!("{e:?}\n{k}"));
    k
}

/// Runs `k` compiled on a pool of `threads` threads.
fn run_on(k: &Kernel, inputs: &[&HostArray], threads: usize) -> Vec<f32> {
    let ck = compile(k).unwrap_or_else(|e| panic!("{e}\n{k}"));
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a pool");
    pool.install(|| {
        let mut out = HostArray::zeros(DType::F32, k.domain.clone());
        ck.run(inputs, &mut [&mut out])
            .unwrap_or_else(|e| panic!("{e}"));
        out.as_slice::<f32>().expect("f32").to_vec()
    })
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Checks `k` (which stores the random values alone) against the interpreter and
/// against `want(position)`, on 1, 2 and 4 threads.
fn check(k: &Kernel, key: i64, want: impl Fn(usize) -> f32) {
    let keys = key_array(key);
    let reference: Vec<f32> = eval_kernel(k, &[&keys]).expect("interprets")[0]
        .to_f64s()
        .into_iter()
        .map(|x| x as f32)
        .collect();
    let expected: Vec<f32> = (0..k.domain.numel()).map(want).collect();
    assert_eq!(bits(&reference), bits(&expected), "interpreter\n{k}");
    for threads in [1, 2, 4] {
        let got = run_on(k, &[&keys], threads);
        assert_eq!(bits(&got), bits(&expected), "{threads} threads\n{k}");
    }
}

#[test]
fn contiguous_domains_with_odd_tails_on_1_2_and_4_threads() {
    for dims in [vec![1], vec![7], vec![1000], vec![4096, 33]] {
        let shape = Shape::new(&dims[..]);
        for key in [0, 42, -5_000_000_007] {
            let k = kernel(&dims, View::contiguous(shape.clone()), false);
            check(&k, key, |p| random_uniform(key, p as u64));
        }
    }
}

#[test]
fn views_read_the_ops_own_positions() {
    let key = 1234;
    // Transpose of a [33, 4096] op: position (i, j) of the [4096, 33] domain is own
    // position j * 4096 + i.
    let t = View::contiguous(Shape::new([33, 4096])).permute(&[1, 0]);
    check(&kernel(&[4096, 33], t, false), key, |p| {
        let (i, j) = (p / 33, p % 33);
        random_uniform(key, (j * 4096 + i) as u64)
    });
    // Broadcast of a [33] op over 1000 rows: every row repeats positions 0..33.
    let b = View::contiguous(Shape::new([33]))
        .expand_dims(0)
        .broadcast_to(&Shape::new([1000, 33]));
    check(&kernel(&[1000, 33], b, false), key, |p| {
        random_uniform(key, (p % 33) as u64)
    });
    // Broadcast of a [1000, 1] op along 33 columns: one value per row.
    let c = View::contiguous(Shape::new([1000, 1])).broadcast_to(&Shape::new([1000, 33]));
    check(&kernel(&[1000, 33], c, false), key, |p| {
        random_uniform(key, (p / 33) as u64)
    });
    // A slice [1::2, 3:10] of a [20, 17] op.
    let s = View {
        shape: Shape::new([9, 7]),
        strides: vec![34, 1],
        offset: 17 + 3,
    };
    check(&kernel(&[9, 7], s, false), key, |p| {
        let (i, j) = (p / 7, p % 7);
        random_uniform(key, ((1 + 2 * i) * 17 + 3 + j) as u64)
    });
}

#[test]
fn positions_past_2_pow_32_use_their_high_half() {
    // A broadcast view whose offset reaches past 2^32 (the op itself would be too big
    // to allocate, but a kernel only computes what it reads).
    let key = 77;
    let base: isize = (1 << 32) - 3;
    let v = View {
        shape: Shape::new([1000]),
        strides: vec![1],
        offset: base,
    };
    check(&kernel(&[1000], v, false), key, |p| {
        random_uniform(key, (base as usize + p) as u64)
    });
}

#[test]
fn fused_with_a_multiply_add() {
    let dims = [4096, 33];
    let shape = Shape::new(dims);
    let n = shape.numel();
    let k = kernel(&dims, View::contiguous(shape.clone()), true);
    let x: Vec<f64> = (0..n).map(|i| (i % 17) as f64 - 8.0).collect();
    let y: Vec<f64> = (0..n).map(|i| (i % 5) as f64 * 0.25).collect();
    let xa = HostArray::from_f64s(DType::F32, shape.clone(), &x);
    let ya = HostArray::from_f64s(DType::F32, shape.clone(), &y);
    let keys = key_array(9);
    let want: Vec<f32> = (0..n)
        .map(|p| random_uniform(9, p as u64) * x[p] as f32 + y[p] as f32)
        .collect();
    let reference: Vec<f32> = eval_kernel(&k, &[&keys, &xa, &ya]).unwrap()[0]
        .to_f64s()
        .into_iter()
        .map(|v| v as f32)
        .collect();
    assert_eq!(bits(&reference), bits(&want));
    for threads in [1, 2, 4] {
        assert_eq!(bits(&run_on(&k, &[&keys, &xa, &ya], threads)), bits(&want));
    }
}

#[test]
fn a_reduce_kernel_with_a_random_op_goes_to_the_interpreter() {
    let domain = Shape::new([4, 8]);
    let k = Kernel {
        name: "k0_random_uniform_sum".into(),
        domain: domain.clone(),
        reduce_axes: vec![1],
        inputs: vec![Buffer {
            dtype: DType::I64,
            len: 1,
        }],
        outputs: vec![Buffer {
            dtype: DType::F32,
            len: 4,
        }],
        body: vec![
            key_load(&domain),
            Instr {
                dtype: DType::F32,
                expr: Expr::Random {
                    key: ValueId(0),
                    view: View::contiguous(domain.clone()),
                },
            },
            Instr {
                dtype: DType::F32,
                expr: Expr::Reduce(Accumulate::Sum, ValueId(1)),
            },
        ],
        stores: vec![Store {
            value: ValueId(2),
            output: 0,
        }],
        plan: Plan::Rows {
            rows: 4,
            row_len: 8,
            contiguous: true,
        },
        plan_reason: "test".into(),
        contraction: None,
    };
    let why = supports(&k).expect_err("refused");
    assert!(why.contains("random op"), "{why}");
}

/// `where(random >= 0.25, x * (4/3), 0)` over `n` positions: dropout's kernel.
fn dropout_kernel(n: usize, store_mask: bool) -> Kernel {
    let domain = Shape::new([n]);
    let f = |expr| Instr {
        dtype: DType::F32,
        expr,
    };
    let mut body = vec![
        key_load(&domain),
        f(Expr::Random {
            key: ValueId(0),
            view: View::contiguous(domain.clone()),
        }),
        f(Expr::Const(ndfuse_ir::Scalar::F(0.25))),
        Instr {
            dtype: DType::Bool,
            expr: Expr::Binary(BinaryOp::Ge, ValueId(1), ValueId(2)),
        },
        f(Expr::Load {
            input: 1,
            view: View::contiguous(domain.clone()),
        }),
        f(Expr::Const(ndfuse_ir::Scalar::F(f64::from(4.0f32 / 3.0)))),
    ];
    body.push(f(Expr::Binary(BinaryOp::Mul, ValueId(4), ValueId(5))));
    body.push(f(Expr::Const(ndfuse_ir::Scalar::F(0.0))));
    body.push(f(Expr::Where(ValueId(3), ValueId(6), ValueId(7))));
    let mut outputs = vec![Buffer {
        dtype: DType::F32,
        len: n,
    }];
    let mut stores = vec![Store {
        value: ValueId(8),
        output: 0,
    }];
    if store_mask {
        outputs.push(Buffer {
            dtype: DType::Bool,
            len: n,
        });
        stores.push(Store {
            value: ValueId(3),
            output: 1,
        });
    }
    let k = Kernel {
        name: "k0_ge_mul_where".into(),
        domain,
        reduce_axes: vec![],
        inputs: vec![
            Buffer {
                dtype: DType::I64,
                len: 1,
            },
            Buffer {
                dtype: DType::F32,
                len: n,
            },
        ],
        outputs,
        body,
        stores,
        plan: Plan::Elementwise,
        plan_reason: "test".into(),
        contraction: None,
    };
    k.check().unwrap_or_else(|e| panic!("{e:?}\n{k}"));
    k
}

#[test]
fn dropout_runs_on_i32x4_lanes_with_the_interpreters_bits() {
    for n in [1, 7, 1001, 4096 * 33 + 5] {
        for store_mask in [false, true] {
            let k = dropout_kernel(n, store_mask);
            let ck = compile(&k).unwrap_or_else(|e| panic!("{e}\n{k}"));
            // The vector loop: the hash on i32x4 lanes, the mask selected lane-wise
            // (a stored mask keeps the kernel scalar: bools are bytes; and a domain of
            // one position is a fixed element, read before any loop).
            let vector = ck.clif().contains("i32x4") && ck.clif().contains("bitselect");
            assert_eq!(vector, !store_mask && n > 1, "{}", ck.clif());
            // x with NaN, infinities and signed zeros among ordinary values.
            let specials = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.0, 0.0, 1.5];
            let x: Vec<f64> = (0..n)
                .map(|i| specials[i % 6] * (1 + i % 5) as f64)
                .collect();
            let xa = HostArray::from_f64s(DType::F32, Shape::new([n]), &x);
            let keys = key_array(31);
            let want = eval_kernel(&k, &[&keys, &xa]).expect("interprets");
            for threads in [1, 2, 4] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .expect("a pool");
                let got = pool.install(|| {
                    let mut outs: Vec<HostArray> = k
                        .outputs
                        .iter()
                        .map(|b| HostArray::zeros(b.dtype, Shape::new([b.len])))
                        .collect();
                    let mut refs: Vec<&mut HostArray> = outs.iter_mut().collect();
                    ck.run(&[&keys, &xa], &mut refs)
                        .unwrap_or_else(|e| panic!("{e}"));
                    outs
                });
                for (g, w) in got.iter().zip(&want) {
                    let (g, w) = (g.to_f64s(), w.to_f64s());
                    let same = g.iter().zip(&w).all(|(p, q)| p.to_bits() == q.to_bits());
                    assert!(same, "n {n}, mask {store_mask}, {threads} threads");
                }
                // Kept where the reference hash says so.
                let y = got[0].to_f64s();
                for (i, yi) in y.iter().enumerate() {
                    let keep = random_uniform(31, i as u64) >= 0.25;
                    let want = if keep {
                        x[i] as f32 * (4.0f32 / 3.0)
                    } else {
                        0.0
                    };
                    let yi = *yi as f32;
                    let same = yi.to_bits() == want.to_bits() || (yi.is_nan() && want.is_nan());
                    assert!(same, "element {i}: {yi} for {want}");
                }
            }
        }
    }
}
