//! The CUDA C of `random_uniform`: a dropout-like kernel (`where(r >= p, x / (1 - p),
//! 0)` with the random op fused) pinned as a snapshot and compiled with NVRTC for an H100
//! when NVRTC is there (`NDFUSE_REQUIRE_NVRTC=1` makes its absence a failure); a
//! reduction of random values emits too (the passes compute the random op in an
//! element-wise kernel), and a matmul epilogue computes it in registers; the emitted
//! hash, compiled as host C++, gives the interpreter's bits.

use ndfuse_codegen_cuda::{compile, emit, nvrtc_version, CompileOptions, CudaKernel, CudaOptions};
use ndfuse_ir::{BinaryOp, DType, Graph, Op, ReduceOp, Scalar, Shape};
use ndfuse_passes::TargetDesc;

fn kernels(g: &Graph) -> Vec<CudaKernel> {
    ndfuse_passes::schedule_for(g, &TargetDesc::cuda())
        .kernels()
        .map(|k| emit(k, &CudaOptions::default()).unwrap_or_else(|e| panic!("{e}")))
        .collect()
}

/// `where(random_uniform(key) >= 0.25, x * (1 / 0.75), 0)` over `shape`.
fn dropout(g: &mut Graph, shape: &[usize]) -> ndfuse_ir::NodeId {
    let s = Shape::new(shape);
    let k = g.add_input("key", DType::I64, Shape::scalar());
    let x = g.add_input("x", DType::F32, s.clone());
    let r = g.add(Op::RandomUniform { shape: s.clone() }, &[k]).unwrap();
    let p = g.add_const(Scalar::F(0.25), DType::F32, s.clone());
    let keep = g.add(Op::Binary(BinaryOp::Ge), &[r, p]).unwrap();
    let scale = g.add_const(Scalar::F(1.0 / 0.75), DType::F32, s.clone());
    let scaled = g.add(Op::Binary(BinaryOp::Mul), &[x, scale]).unwrap();
    let zero = g.add_const(Scalar::F(0.0), DType::F32, s);
    g.add(Op::Where, &[keep, scaled, zero]).unwrap()
}

fn dropout_graph() -> Graph {
    let mut g = Graph::new();
    let y = dropout(&mut g, &[64, 33]);
    g.add_output(y);
    g
}

#[test]
fn dropout_kernel_cuda_c() {
    let ks = kernels(&dropout_graph());
    assert_eq!(ks.len(), 1);
    let src = &ks[0].source;
    assert!(src.contains("nd_random_uniform(v0, "), "{src}");
    insta::assert_snapshot!("random_dropout_cuda", src);
}

/// `sum(dropout(x), axis=1)` over [16, 40].
fn reduction_graph() -> Graph {
    let mut g = Graph::new();
    let y = dropout(&mut g, &[16, 40]);
    let s = g
        .add(
            Op::Reduce {
                op: ReduceOp::Sum,
                axes: vec![1],
                keepdims: false,
            },
            &[y],
        )
        .unwrap();
    g.add_output(s);
    g
}

/// `(a @ b) * random_uniform(key)` over [2, 8, 6].
fn epilogue_graph() -> Graph {
    let mut g = Graph::new();
    let k = g.add_input("key", DType::I64, Shape::scalar());
    let a = g.add_input("a", DType::F32, Shape::new([2, 8, 5]));
    let b = g.add_input("b", DType::F32, Shape::new([5, 6]));
    let p = g.add(Op::MatMul, &[a, b]).unwrap();
    let r = g
        .add(
            Op::RandomUniform {
                shape: Shape::new([2, 8, 6]),
            },
            &[k],
        )
        .unwrap();
    let e = g.add(Op::Binary(BinaryOp::Mul), &[p, r]).unwrap();
    g.add_output(e);
    g
}

#[test]
fn a_reduction_and_a_matmul_epilogue_emit() {
    let ks = kernels(&reduction_graph());
    assert_eq!(ks.len(), 2);
    assert!(ks[0].source.contains("nd_random_uniform("));
    assert!(!ks[1].source.contains("nd_random_uniform("));
    let ks = kernels(&epilogue_graph());
    assert_eq!(ks.len(), 1);
    // The epilogue's own position in [2, 8, 6]: batch b0, row m, column n.
    assert!(
        ks[0]
            .source
            .contains("nd_random_uniform(v1, (long long)(b0 * 48 + m * 6 + n))"),
        "{}",
        ks[0].source
    );
}

#[test]
fn random_kernels_compile_with_nvrtc() {
    if let Err(e) = nvrtc_version() {
        if std::env::var("NDFUSE_REQUIRE_NVRTC").is_ok_and(|v| v == "1") {
            panic!("NDFUSE_REQUIRE_NVRTC=1 but {e}");
        }
        eprintln!("random_kernels_compile_with_nvrtc: skipped: {e}");
        return;
    }
    let opts = CompileOptions::for_capability(9, 0);
    for g in [dropout_graph(), reduction_graph(), epilogue_graph()] {
        for k in kernels(&g) {
            let c = compile(&k, &opts).unwrap_or_else(|e| panic!("{e}"));
            assert!(!c.image.is_empty());
        }
    }
}

/// The emitted device helpers, compiled as host C++ (`g++`, `$CXX`) with `__device__`
/// and `__forceinline__` defined away: `nd_random_uniform` gives the interpreter's bits.
/// Skipped, with the reason printed, without a C++ compiler.
#[test]
fn the_emitted_hash_gives_the_interpreters_bits() {
    use std::process::Command;
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    if !Command::new(&cxx)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        eprintln!("the_emitted_hash_gives_the_interpreters_bits: skipped: no {cxx}");
        return;
    }
    let src = &kernels(&dropout_graph())[0].source;
    let start = src
        .find("// random_uniform")
        .expect("the helper is emitted");
    let end = start + src[start..].find("\n}\n").expect("the helper ends") + 3;
    let cases: Vec<(i64, u64)> = [0i64, 42, -1, 1 << 40, i64::MIN, 0x1234_5678_9abc_def0]
        .into_iter()
        .flat_map(|k| {
            [
                0u64,
                1,
                7,
                4095,
                1 << 31,
                (1 << 32) - 1,
                1 << 32,
                (1 << 40) + 3,
            ]
            .map(|i| (k, i))
        })
        .collect();
    let calls: String = cases
        .iter()
        .map(|(k, i)| {
            format!(
                "  {{ float f = nd_random_uniform((long long){k}LL, (long long){i}ULL); unsigned u; memcpy(&u, &f, 4); printf(\"%u\\n\", u); }}\n"
            )
        })
        .collect();
    let program = format!(
        "#include <cstdio>\n#include <cstring>\n#define __device__\n#define __forceinline__ inline\n{}\nint main() {{\n{calls}  return 0;\n}}\n",
        &src[start..end]
    );
    let dir = std::env::temp_dir().join(format!("ndfuse-random-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let (cpp, exe) = (dir.join("hash.cpp"), dir.join("hash"));
    std::fs::write(&cpp, &program).expect("writes");
    let built = Command::new(&cxx)
        .args(["-O1", "-o"])
        .arg(&exe)
        .arg(&cpp)
        .output()
        .expect("runs the compiler");
    assert!(
        built.status.success(),
        "{}\n{program}",
        String::from_utf8_lossy(&built.stderr)
    );
    let out = Command::new(&exe).output().expect("runs");
    let got: Vec<u32> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.parse().expect("a number"))
        .collect();
    let want: Vec<u32> = cases
        .iter()
        .map(|&(k, i)| ndfuse_ir::op::random_uniform(k, i).to_bits())
        .collect();
    assert_eq!(got, want);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A small domain reading positions past 2^31 of a random op: the index type is wide.
#[test]
fn positions_past_2_pow_31_index_in_long_long() {
    use ndfuse_ir::{Buffer, Expr, Instr, Kernel, Plan, Store, ValueId, View};
    let domain = Shape::new([1000]);
    let kernel = |offset: isize| Kernel {
        name: "k0_random_uniform".into(),
        domain: domain.clone(),
        reduce_axes: vec![],
        inputs: vec![Buffer {
            dtype: DType::I64,
            len: 1,
        }],
        outputs: vec![Buffer {
            dtype: DType::F32,
            len: 1000,
        }],
        body: vec![
            Instr {
                dtype: DType::I64,
                expr: Expr::Load {
                    input: 0,
                    view: View {
                        shape: domain.clone(),
                        strides: vec![0],
                        offset: 0,
                    },
                },
            },
            Instr {
                dtype: DType::F32,
                expr: Expr::Random {
                    key: ValueId(0),
                    view: View {
                        shape: domain.clone(),
                        strides: vec![1],
                        offset,
                    },
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
    };
    let small = emit(&kernel(5), &CudaOptions::default()).unwrap();
    assert!(small.source.contains("typedef int nd_idx;"));
    let far = emit(&kernel(1 << 32), &CudaOptions::default()).unwrap();
    assert!(
        far.source.contains("typedef long long nd_idx;"),
        "{}",
        far.source
    );
    assert!(far.source.contains("4294967296"), "{}", far.source);
}
