//! `ndfuse::grad` from the user's side: composites (softmax, log_softmax, layernorm,
//! gelu), implicit broadcasting, slices and matmul against central finite differences
//! in f64 on the interp backend (`h = 6e-6`, about the cube root of f64's epsilon;
//! `|grad - fd| <= 1e-6 max(1, |fd|)`); the kernel counts of backward passes on the
//! cpu backend, each compared with the interpreter; and the errors.

use ndfuse::{BackendKind, Context, DType, Error, SliceArg, Tensor};

const H: f64 = 6e-6;
const TOL: f64 = 1e-6;

fn interp() -> Context {
    Context::builder()
        .backend(BackendKind::Interp)
        .dtype(DType::F64)
        .build()
        .expect("an interp context")
}

/// Deterministic values in `[lo, hi)`.
fn values(n: usize, seed: u64, lo: f64, hi: f64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            let u = (s.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64;
            lo + (hi - lo) * u
        })
        .collect()
}

fn scalar(t: &Tensor) -> f64 {
    t.eval().expect("eval").to_vec::<f64>().expect("f64")[0]
}

/// Checks `grad` of `f(inputs)` (which must be 0-d) against central differences with
/// respect to every input.
fn check(what: &str, shapes: &[&[usize]], f: impl Fn(&[Tensor]) -> Tensor) {
    let ctx = interp();
    let data: Vec<Vec<f64>> = shapes
        .iter()
        .enumerate()
        .map(|(k, s)| values(s.iter().product(), k as u64 + 1, -1.5, 1.5))
        .collect();
    let leaves = |data: &[Vec<f64>]| -> Vec<Tensor> {
        data.iter()
            .zip(shapes)
            .map(|(d, s)| ctx.from_vec(d.clone(), s).expect("leaf"))
            .collect()
    };
    let xs = leaves(&data);
    let loss = f(&xs);
    let refs: Vec<&Tensor> = xs.iter().collect();
    let grads = ndfuse::grad(&loss, &refs).expect("grad");
    for (k, g) in grads.iter().enumerate() {
        assert_eq!(g.shape().expect("shape"), shapes[k], "{what}");
        let got = g.eval().expect("eval").to_vec::<f64>().expect("f64");
        for i in 0..data[k].len() {
            let at = |d: f64| {
                let mut moved = data.clone();
                moved[k][i] += d;
                scalar(&f(&leaves(&moved)))
            };
            let fd = (at(H) - at(-H)) / (2.0 * H);
            let err = (got[i] - fd).abs() / fd.abs().max(1.0);
            assert!(
                err <= TOL,
                "{what}: d/dx{k}[{i}]: grad {}, fd {fd}, error {err:e}",
                got[i]
            );
        }
    }
}

#[test]
fn composites_through_their_primitives() {
    check("softmax", &[&[3, 5], &[3, 5]], |x| {
        (x[0].softmax(-1) * &x[1]).sum(..)
    });
    check("log_softmax", &[&[2, 4], &[2, 4]], |x| {
        (x[0].log_softmax(0) * &x[1]).sum(..)
    });
    check("layernorm", &[&[3, 6], &[3, 6]], |x| {
        (x[0].layernorm(-1, 1e-5) * &x[1]).sum(..)
    });
    check("gelu", &[&[7]], |x| x[0].gelu().sum(..));
    check("gelu_erf", &[&[7]], |x| x[0].gelu_erf().sum(..));
}

#[test]
fn implicit_broadcasting_slices_and_matmul() {
    check("x * b + c, broadcast", &[&[3, 4], &[4], &[3, 1]], |x| {
        ((&x[0] * &x[1] + &x[2]).tanh()).mean(..)
    });
    check("slice with a negative step", &[&[5, 4]], |x| {
        x[0].slice(&[SliceArg::from(1..4), SliceArg::all().step(-2)])
            .sin()
            .sum(..)
    });
    check("matmul, 1-D and batched", &[&[4], &[2, 4, 3], &[3]], |x| {
        x[0].matmul(&x[1]).matmul(&x[2]).square().sum(..)
    });
    check(
        "linear layer + relu + mse",
        &[&[5, 3], &[3, 2], &[2], &[5, 2]],
        |x| {
            let y = (x[0].matmul(&x[1]) + &x[2]).relu();
            (y - &x[3]).square().mean(..)
        },
    );
}

/// The kernels of evaluating `outputs` on the cpu backend, after checking their values
/// against the interpreter.
fn cpu_kernels(outputs: &[&Tensor]) -> (usize, String) {
    let ctx = outputs[0].context();
    let (got, report) = ctx.eval_report(outputs).expect("cpu eval");
    let interp = outputs[0].context().clone();
    interp.set_backend(BackendKind::Interp);
    let want = interp.eval(outputs).expect("interp eval");
    interp.set_backend(BackendKind::Cpu);
    for (g, w) in got.iter().zip(&want) {
        let (g, w) = (
            g.to_vec::<f32>().expect("f32"),
            w.to_vec::<f32>().expect("f32"),
        );
        for (a, b) in g.iter().zip(&w) {
            assert!(
                (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                "cpu {a} vs interp {b}"
            );
        }
    }
    (report.kernel_count(), report.annotated_graph())
}

#[test]
fn an_elementwise_chains_backward_is_one_kernel() {
    let ctx = Context::builder()
        .backend(BackendKind::Cpu)
        .build()
        .expect("ctx");
    let x = ctx.rand_uniform(&[64, 33], -2.0, 2.0, 1);
    let b = ctx.rand_uniform(&[33], 0.1, 2.0, 2);
    let loss = ((&x * &b).tanh().exp() + x.sin()).sum(..);
    let g = ndfuse::grad(&loss, &[&x]).expect("grad");
    let (n, text) = cpu_kernels(&[&g[0]]);
    assert_eq!(n, 1, "{text}");
}

#[test]
fn the_softmax_cross_entropy_backward_fuses() {
    let ctx = Context::builder()
        .backend(BackendKind::Cpu)
        .build()
        .expect("ctx");
    let logits = ctx.rand_uniform(&[32, 10], -3.0, 3.0, 1);
    let labels = ctx.rand_uniform(&[32, 10], 0.0, 1.0, 2);
    let loss = -(logits.log_softmax(-1) * &labels).sum(..) / 32.0;
    let g = ndfuse::grad(&loss, &[&logits]).expect("grad");
    let (n, text) = cpu_kernels(&[&g[0]]);
    assert_eq!(n, SOFTMAX_XENT_BACKWARD_KERNELS, "{text}");
}

/// Measured (1); the target is 1.
const SOFTMAX_XENT_BACKWARD_KERNELS: usize = 1;

#[test]
fn the_layernorm_backward_kernel_count() {
    let ctx = Context::builder()
        .backend(BackendKind::Cpu)
        .build()
        .expect("ctx");
    let x = ctx.rand_uniform(&[16, 24], -2.0, 2.0, 1);
    let w = ctx.rand_uniform(&[16, 24], -1.0, 1.0, 2);
    let loss = (x.layernorm(-1, 1e-5) * &w).sum(..);
    let g = ndfuse::grad(&loss, &[&x]).expect("grad");
    let (n, text) = cpu_kernels(&[&g[0]]);
    assert_eq!(n, LAYERNORM_BACKWARD_KERNELS, "{text}");
}

/// Measured (1); the target is at most 2.
const LAYERNORM_BACKWARD_KERNELS: usize = 1;

#[test]
fn a_non_scalar_loss_is_an_error_naming_its_shape_and_the_call() {
    let ctx = interp();
    let x = ctx.from_vec(vec![1.0f64; 6], &[2, 3]).expect("leaf");
    let y = x.exp();
    let line = line!() + 1;
    let e = ndfuse::grad(&y, &[&x]).expect_err("a [2,3] loss");
    let text = e.to_string();
    assert!(matches!(e, Error::Argument { what: "grad", .. }), "{text}");
    assert!(
        text.contains("f64[2,3]") && text.contains(&format!("grad.rs:{line}")),
        "{text}"
    );
}

#[test]
fn a_parameter_the_loss_does_not_depend_on_gets_zeros() {
    let ctx = interp();
    let x = ctx.from_vec(vec![1.0f64, 2.0], &[2]).expect("leaf");
    let unused = ctx.from_vec(vec![5.0f64; 6], &[3, 2]).expect("leaf");
    let loss = x.square().sum(..);
    let g = ndfuse::grad(&loss, &[&x, &unused]).expect("grad");
    assert_eq!(
        g[0].eval().expect("eval").to_vec::<f64>().expect("f64"),
        vec![2.0, 4.0]
    );
    assert_eq!(g[1].shape().expect("shape"), &[3, 2]);
    assert_eq!(
        g[1].eval().expect("eval").to_vec::<f64>().expect("f64"),
        vec![0.0; 6]
    );
}

#[test]
fn a_loss_and_its_gradients_evaluate_as_one_graph() {
    let ctx = Context::builder()
        .backend(BackendKind::Cpu)
        .build()
        .expect("ctx");
    let w = ctx.rand_uniform(&[8, 4], -1.0, 1.0, 1);
    let b = ctx.rand_uniform(&[4], -1.0, 1.0, 2);
    let x = ctx.rand_uniform(&[16, 8], -1.0, 1.0, 3);
    let loss = (x.matmul(&w) + &b).tanh().square().mean(..);
    let g = ndfuse::grad(&loss, &[&w, &b]).expect("grad");
    let out = ctx.eval(&[&loss, &g[0], &g[1]]).expect("eval");
    assert_eq!(out[1].shape(), &[8, 4]);
    assert_eq!(out[2].shape(), &[4]);
    let (n, text) = cpu_kernels(&[&loss, &g[0], &g[1]]);
    // Measured: the forward matmul with its epilogue and the backward's element-wise
    // part (one kernel), the mean, x^T @ dy for dW, and the column sum for db.
    assert_eq!(n, 4, "{text}");
}

#[test]
fn grad_in_the_expression_language() {
    let ctx = interp();
    let x = ctx
        .from_vec(values(32, 1, -2.0, 2.0), &[4, 8])
        .expect("leaf");
    let y = ctx
        .from_vec(values(32, 2, 0.0, 1.0), &[4, 8])
        .expect("leaf");
    let text = "grad(sum(softmax(x, axis=-1) * y), x)";
    let got = ctx
        .evaluate(text, &[("x", &x), ("y", &y)])
        .expect("evaluate");
    let want = ndfuse::grad(&(x.softmax(-1) * &y).sum(..), &[&x]).expect("grad");
    let want = want[0].eval().expect("eval");
    assert_eq!(
        got.to_vec::<f64>().expect("f64"),
        want.to_vec::<f64>().expect("f64")
    );
    // Bad uses: a loss that is not 0-d, a wrt that is not an input name.
    let e = ctx
        .evaluate("grad(x * y, x)", &[("x", &x), ("y", &y)])
        .expect_err("a [4,8] loss");
    assert!(
        e.to_string().contains("0-d float value, got f64[4,8]"),
        "{e}"
    );
    let e = ctx
        .evaluate("grad(sum(x), x * 2)", &[("x", &x)])
        .expect_err("an expression as x");
    assert!(e.to_string().contains("x must be an input name"), "{e}");
}
