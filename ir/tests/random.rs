//! Tests of `random_uniform`, the counter-based random op: its bits pinned at fixed
//! (key, index) pairs to values computed by an independent Python transcription of the
//! documented hash (`mix32` = lowbias32; see `Op::RandomUniform`), its statistics over a
//! million values, the kernel form against the graph form through views, and the key's
//! type errors.

use ndfuse_ir::interp::{eval, eval_kernel};
use ndfuse_ir::op::{random_bits, random_uniform};
use ndfuse_ir::{
    Buffer, DType, Expr, Graph, HostArray, Instr, IrError, Kernel, Op, Plan, Shape, Storage, Store,
    ValueId, View, ViewOp,
};
use std::collections::HashMap;

/// `(key, index, bits)`, from this Python (independent of the code under test):
/// ```text
/// M=0xffffffff
/// def mix32(x): x^=x>>16; x=(x*0x7feb352d)&M; x^=x>>15; x=(x*0x846ca68b)&M; return x^(x>>16)
/// def bits(key,i):
///     key&=(1<<64)-1; k0=key&M; k1=key>>32; c0=i&M; c1=i>>32
///     h=mix32(k0 ^ mix32(k1 ^ mix32(c1 ^ 0x9e3779b9)))
///     return mix32((mix32(c0^h)+h)&M)
/// ```
const PINNED: [(i64, u64, u32); 9] = [
    (0, 0, 0x9113_0914),
    (0, 1, 0x4028_d282),
    (42, 0, 0x0521_7210),
    (42, 7, 0x77e3_fc53),
    (42, 1000, 0x0fdb_9e98),
    (-1, 3, 0xf9dd_3336),
    (1 << 40, 5, 0xb2a2_f905),
    (7, (1 << 32) + 3, 0x32aa_8809),
    (123_456_789, 4095, 0xa6e0_315b),
];

#[test]
fn bits_are_pinned_to_the_documented_hash() {
    for (key, i, bits) in PINNED {
        assert_eq!(random_bits(key, i), bits, "key {key} index {i}");
        let want = f64::from(bits >> 8) / 16_777_216.0;
        assert_eq!(
            f64::from(random_uniform(key, i)),
            want,
            "key {key} index {i}"
        );
    }
    // Python: 0.5666967034339905 and 0.19791460037231445.
    assert_eq!(random_uniform(0, 0), 0.566_696_7_f32);
    assert_eq!(
        f64::from(random_uniform(7, (1 << 32) + 3)),
        0.19791460037231445
    );
}

fn key_array(key: i64) -> HostArray {
    HostArray::new(Shape::scalar(), Storage::from_i64s(DType::I64, &[key])).expect("one element")
}

/// `random_uniform` of `shape` under `key`, evaluated by the graph interpreter.
fn graph_values(shape: &[usize], key: i64) -> Vec<f64> {
    let mut g = Graph::new();
    let k = g.add_input("key", DType::I64, Shape::scalar());
    let r = g
        .add(
            Op::RandomUniform {
                shape: Shape::from(shape),
            },
            &[k],
        )
        .expect("a 0-d i64 key is valid");
    g.add_output(r);
    let out = eval(&g, &HashMap::from([(k, key_array(key))])).expect("evaluates");
    assert_eq!(out[0].dtype(), DType::F32);
    assert_eq!(out[0].shape(), &Shape::from(shape));
    out[0].to_f64s()
}

#[test]
fn graph_values_are_the_pinned_bits_at_row_major_positions() {
    let v = graph_values(&[2, 4, 126], 42);
    for (key, i, bits) in PINNED.iter().filter(|p| p.0 == 42) {
        assert_eq!(*key, 42);
        assert_eq!(v[*i as usize], f64::from(bits >> 8) / 16_777_216.0);
    }
}

#[test]
fn statistics_of_a_million_values() {
    const N: usize = 1 << 20;
    let v = graph_values(&[N], 20_261_124);
    let mean = v.iter().sum::<f64>() / N as f64;
    let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / N as f64;
    assert!((mean - 0.5).abs() < 0.002, "mean {mean}");
    assert!((var - 1.0 / 12.0).abs() < 0.002, "variance {var}");
    assert!(v.iter().all(|&x| (0.0..1.0).contains(&x)));
    // Chi-square over 256 equal bins: 255 degrees of freedom, mean 255, sd ~22.6;
    // 400 is more than 6 sd out.
    let mut bins = [0usize; 256];
    for &x in &v {
        bins[(x * 256.0) as usize] += 1;
    }
    let e = N as f64 / 256.0;
    let chi2: f64 = bins.iter().map(|&o| (o as f64 - e).powi(2) / e).sum();
    assert!(chi2 < 400.0 && chi2 > 150.0, "chi-square {chi2}");
    // Correlation of neighbours (x[i], x[i+1]).
    let (a, b) = (&v[..N - 1], &v[1..]);
    let cov = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - mean) * (y - mean))
        .sum::<f64>()
        / (N - 1) as f64;
    let r = cov / var;
    assert!(r.abs() < 0.01, "neighbour correlation {r}");
}

#[test]
fn keys_one_bit_apart_give_unrelated_sequences() {
    const N: usize = 1 << 16;
    for bit in [0, 1, 17, 31, 32, 45, 63] {
        let a = graph_values(&[N], 0x1234_5678_9abc_def0);
        let b = graph_values(&[N], 0x1234_5678_9abc_def0 ^ (1i64 << bit));
        let same = a.iter().zip(&b).filter(|(x, y)| x == y).count();
        // Equal 24-bit values happen by chance with probability 2^-24 each.
        assert!(same <= 2, "bit {bit}: {same} equal positions of {N}");
    }
}

#[test]
fn the_key_must_be_a_0d_i64() {
    let mut g = Graph::new();
    let op = Op::RandomUniform {
        shape: Shape::new([3]),
    };
    for (dtype, shape) in [
        (DType::I32, Shape::scalar()),
        (DType::F32, Shape::scalar()),
        (DType::I64, Shape::new([1])),
    ] {
        let k = g.add_input(format!("k{dtype}{shape}"), dtype, shape.clone());
        let err = g.add(op.clone(), &[k]).expect_err("a bad key is refused");
        assert!(matches!(
            err,
            IrError::BadDType {
                op: "random_uniform",
                ..
            }
        ));
        let text = err.to_string();
        assert!(text.contains(&format!("{dtype}{shape}")), "{text}");
        assert!(text.contains("0-d i64"), "{text}");
    }
}

/// A kernel over `domain` reading a random op of shape `own` through `view` (whose
/// offsets are row-major positions of `own`), storing the values.
fn random_kernel(domain: &Shape, view: View) -> Kernel {
    Kernel {
        name: "k0_random_uniform".into(),
        domain: domain.clone(),
        reduce_axes: vec![],
        inputs: vec![Buffer {
            dtype: DType::I64,
            len: 1,
        }],
        outputs: vec![Buffer {
            dtype: DType::F32,
            len: domain.numel(),
        }],
        body: vec![
            Instr {
                dtype: DType::I64,
                expr: Expr::Load {
                    input: 0,
                    view: View::contiguous(Shape::scalar())
                        .reshape(&Shape::new(vec![1; domain.rank()]))
                        .expect("adding unit axes is a reshape")
                        .broadcast_to(domain),
                },
            },
            Instr {
                dtype: DType::F32,
                expr: Expr::Random {
                    key: ValueId(0),
                    view,
                },
            },
        ],
        stores: vec![Store {
            value: ValueId(1),
            output: 0,
        }],
        plan: Plan::Elementwise,
        plan_reason: "test".into(),
        contraction: None,
    }
}

#[test]
fn a_kernel_reads_the_ops_own_positions_through_views() {
    let own = Shape::new([3, 5]);
    let key = -77;
    // Transposed: domain [5, 3], position (j, i) is own position i * 5 + j.
    let t = View::contiguous(own.clone()).permute(&[1, 0]);
    let domain = t.shape.clone();
    let out = eval_kernel(&random_kernel(&domain, t), &[&key_array(key)]).expect("runs");
    let got = out[0].to_f64s();
    for j in 0..5 {
        for i in 0..3 {
            let want = f64::from(random_uniform(key, (i * 5 + j) as u64));
            assert_eq!(got[j * 3 + i], want, "({j}, {i})");
        }
    }
    // Broadcast along a new leading axis: every row repeats positions 0..15.
    let b = View::contiguous(own.clone())
        .expand_dims(0)
        .broadcast_to(&Shape::new([2, 3, 5]));
    let domain = b.shape.clone();
    let out = eval_kernel(&random_kernel(&domain, b), &[&key_array(key)]).expect("runs");
    let got = out[0].to_f64s();
    for r in 0..2 {
        for p in 0..15 {
            assert_eq!(got[r * 15 + p], f64::from(random_uniform(key, p as u64)));
        }
    }
    // The graph form through the same transpose agrees.
    let mut g = Graph::new();
    let k = g.add_input("key", DType::I64, Shape::scalar());
    let r = g.add(Op::RandomUniform { shape: own }, &[k]).unwrap();
    let p = g.add(Op::View(ViewOp::Permute(vec![1, 0])), &[r]).unwrap();
    g.add_output(p);
    let via_graph = eval(&g, &HashMap::from([(k, key_array(key))])).unwrap();
    let t = View::contiguous(Shape::new([3, 5])).permute(&[1, 0]);
    let via_kernel = eval_kernel(&random_kernel(&t.shape.clone(), t), &[&key_array(key)]).unwrap();
    assert_eq!(via_graph[0].to_f64s(), via_kernel[0].to_f64s());
}

#[test]
fn kernel_check_refuses_a_float_key_a_varying_key_and_negative_positions() {
    let domain = Shape::new([4]);
    let mut k = random_kernel(&domain, View::contiguous(domain.clone()));
    k.body[0].dtype = DType::F32;
    k.inputs[0].dtype = DType::F32;
    let errs = k.check().expect_err("an f32 key is malformed");
    assert!(errs.iter().any(|e| e.contains("i64 key")), "{errs:?}");
    // A key that varies over the domain.
    let mut k = random_kernel(&domain, View::contiguous(domain.clone()));
    k.inputs[0].len = 4;
    k.body[0].expr = Expr::Load {
        input: 0,
        view: View::contiguous(domain.clone()),
    };
    let errs = k.check().expect_err("a varying key is malformed");
    assert!(
        errs.iter()
            .any(|e| e.contains("one value for the whole kernel")),
        "{errs:?}"
    );
    let mut view = View::contiguous(domain.clone());
    view.offset = -1;
    let errs = random_kernel(&domain, view)
        .check()
        .expect_err("negative position");
    assert!(errs.iter().any(|e| e.contains("positions -1")), "{errs:?}");
}
