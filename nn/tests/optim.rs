//! The optimisers against their textbook updates, written here independently in f64 on
//! plain vectors (PyTorch's documented algorithms), over ten steps of changing
//! gradients; and the fusion of a step: one kernel per parameter tensor.

use ndfuse::{Context, DType, Tensor};
use ndfuse_nn::{Optimizer, Parameter, Schedule};

const STEPS: usize = 10;

/// The gradient of step `t` for element `i`: varied signs and sizes.
fn grad_at(t: usize, i: usize) -> f64 {
    ((t * 7 + i * 3) as f64).sin() * (1.0 + i as f64 * 0.25)
}

fn start() -> Vec<f64> {
    vec![0.5, -1.25, 2.0, 0.0, -0.75]
}

/// Runs `opt` (built over one f64 parameter of `start()`) for `STEPS` steps with the
/// gradients of `grad_at`, returning the parameter after each step.
fn run(make: impl Fn(&[Parameter]) -> Optimizer) -> Vec<Vec<f64>> {
    let ctx = Context::builder().dtype(DType::F64).build().unwrap();
    let w0 = start();
    let p = Parameter::new("w", &ctx.from_vec(w0.clone(), &[w0.len()]).unwrap()).unwrap();
    let mut opt = make(std::slice::from_ref(&p));
    (0..STEPS)
        .map(|t| {
            let g: Vec<f64> = (0..w0.len()).map(|i| grad_at(t, i)).collect();
            let g = ctx.from_vec(g, &[w0.len()]).unwrap();
            opt.step(&[g]).unwrap();
            p.array().unwrap().to_vec::<f64>().unwrap()
        })
        .collect()
}

fn assert_close(got: &[Vec<f64>], want: &[Vec<f64>], what: &str) {
    for (t, (g, w)) in got.iter().zip(want).enumerate() {
        for (i, (a, b)) in g.iter().zip(w).enumerate() {
            // f64 end to end: only rounding differs (association order, fused ops).
            assert!(
                (a - b).abs() <= 1e-12 * (1.0 + b.abs()),
                "{what}: step {t} element {i}: {a} vs textbook {b}"
            );
        }
    }
}

/// PyTorch's SGD (torch.optim.SGD docs), with the buffer starting at zero.
fn sgd_reference(
    rate: &dyn Fn(usize) -> f64,
    mu: f64,
    damp: f64,
    nesterov: bool,
    wd: f64,
) -> Vec<Vec<f64>> {
    let mut w = start();
    let mut b = vec![0.0; w.len()];
    (0..STEPS)
        .map(|t| {
            for i in 0..w.len() {
                let mut g = grad_at(t, i) + wd * w[i];
                if mu != 0.0 {
                    b[i] = mu * b[i] + (1.0 - damp) * g;
                    g = if nesterov { g + mu * b[i] } else { b[i] };
                }
                w[i] -= rate(t) * g;
            }
            w.clone()
        })
        .collect()
}

/// PyTorch's Adam / AdamW (torch.optim.Adam, torch.optim.AdamW docs).
fn adam_reference(lr: f64, b1: f64, b2: f64, eps: f64, wd: f64, decoupled: bool) -> Vec<Vec<f64>> {
    let mut w = start();
    let (mut m, mut v) = (vec![0.0; w.len()], vec![0.0; w.len()]);
    (0..STEPS)
        .map(|t| {
            let n = (t + 1) as i32;
            for i in 0..w.len() {
                let mut g = grad_at(t, i);
                if decoupled {
                    w[i] *= 1.0 - lr * wd;
                } else {
                    g += wd * w[i];
                }
                m[i] = b1 * m[i] + (1.0 - b1) * g;
                v[i] = b2 * v[i] + (1.0 - b2) * g * g;
                let mh = m[i] / (1.0 - b1.powi(n));
                let vh = v[i] / (1.0 - b2.powi(n));
                w[i] -= lr * mh / (vh.sqrt() + eps);
            }
            w.clone()
        })
        .collect()
}

#[test]
fn sgd_plain_momentum_nesterov_and_weight_decay_match_the_textbook() {
    let c = |r| move |_: usize| r;
    assert_close(
        &run(|p| Optimizer::sgd(p, 0.1)),
        &sgd_reference(&c(0.1), 0.0, 0.0, false, 0.0),
        "sgd",
    );
    assert_close(
        &run(|p| Optimizer::sgd(p, 0.1).momentum(0.9)),
        &sgd_reference(&c(0.1), 0.9, 0.0, false, 0.0),
        "momentum",
    );
    assert_close(
        &run(|p| {
            Optimizer::sgd(p, 0.05)
                .momentum(0.8)
                .nesterov(true)
                .weight_decay(0.01)
        }),
        &sgd_reference(&c(0.05), 0.8, 0.0, true, 0.01),
        "nesterov + weight decay",
    );
    assert_close(
        &run(|p| Optimizer::sgd(p, 0.05).momentum(0.5).dampening(0.3)),
        &sgd_reference(&c(0.05), 0.5, 0.3, false, 0.0),
        "dampening",
    );
    let s = Schedule::Step {
        base: 0.2,
        gamma: 0.5,
        every: 3,
    };
    let rate = |t: usize| s.rate(t as u64);
    assert_close(
        &run(|p| Optimizer::sgd(p, 0.0).schedule(s.clone())),
        &sgd_reference(&rate, 0.0, 0.0, false, 0.0),
        "scheduled sgd",
    );
}

#[test]
fn adam_and_adamw_match_the_textbook() {
    assert_close(
        &run(|p| Optimizer::adam(p, 0.01)),
        &adam_reference(0.01, 0.9, 0.999, 1e-8, 0.0, false),
        "adam",
    );
    assert_close(
        &run(|p| {
            Optimizer::adam(p, 0.02)
                .betas(0.8, 0.99)
                .eps(1e-6)
                .weight_decay(0.1)
        }),
        &adam_reference(0.02, 0.8, 0.99, 1e-6, 0.1, false),
        "adam + L2",
    );
    assert_close(
        &run(|p| Optimizer::adamw(p, 0.01, 0.05)),
        &adam_reference(0.01, 0.9, 0.999, 1e-8, 0.05, true),
        "adamw",
    );
}

#[test]
fn a_step_over_several_parameters_is_one_kernel_per_parameter_and_the_graph_stays_the_same() {
    let ctx = Context::new();
    let shapes: [&[usize]; 4] = [&[64, 32], &[32], &[32, 10], &[10]];
    let params: Vec<Parameter> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| {
            Parameter::new(format!("p{i}"), &ctx.rand_normal(s, 0.0, 1.0, i as u64)).unwrap()
        })
        .collect();
    let opt = Optimizer::adamw(&params, 1e-3, 0.01);
    let grads: Vec<Tensor> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| ctx.rand_normal(s, 0.0, 1.0, 10 + i as u64))
        .collect();
    let update = opt.update(&grads).unwrap();
    let outputs: Vec<&Tensor> = update.params.iter().chain(&update.state).collect();
    let (_, report) = ctx.eval_report(&outputs).unwrap();
    // p, m and v of a parameter come out of one kernel.
    assert_eq!(
        report.kernel_count(),
        shapes.len(),
        "{}",
        report.kernels_text()
    );
    // The next step's graph (new rate, new bias corrections) is the same graph: its
    // scalars are data, so it is a compile-cache hit.
    let mut opt = opt;
    opt.step(&grads).unwrap();
    let update = opt.update(&grads).unwrap();
    let again: Vec<&Tensor> = update.params.iter().chain(&update.state).collect();
    let (_, r2) = ctx.eval_report(&again).unwrap();
    assert!(
        r2.evaluation().compile_cached,
        "step 2 recompiled:\n{}",
        ctx.graph_text(&again).unwrap()
    );
}

#[test]
fn mismatched_gradients_and_state_are_errors_that_change_nothing() {
    let ctx = Context::new();
    let p = Parameter::new("w", &ctx.ones(&[3])).unwrap();
    let mut opt = Optimizer::adam(std::slice::from_ref(&p), 0.1);
    let err = opt.update(&[]).unwrap_err().to_string();
    assert!(err.contains("0 gradients for 1 parameters"), "{err}");
    let bad = ndfuse::Array::from_vec(vec![1.0f32; 4], &[4]).unwrap();
    let err = opt
        .load_state(vec![bad.clone(), bad], 5)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("[3]") && err.contains("[4]") && err.contains("w.m"),
        "{err}"
    );
    assert_eq!(opt.steps(), 0);
    assert_eq!(p.array().unwrap().to_vec::<f32>().unwrap(), vec![1.0; 3]);
}

/// The gradient of step `t` for element `i` of a two-parameter model: small on even
/// steps (under the clipping norm), large on odd ones (clipped).
fn grad2(t: usize, i: usize) -> f64 {
    let scale = if t.is_multiple_of(2) { 0.05 } else { 3.0 };
    grad_at(t, i) * scale
}

/// Runs `make` over a matrix `w [2, 3]` and a bias `b [3]` (f64) for `STEPS` steps of
/// `grad2` (w's elements first), returning both, joined, after each step.
fn run2(make: impl Fn(&[Parameter]) -> Optimizer) -> Vec<Vec<f64>> {
    let ctx = Context::builder().dtype(DType::F64).build().unwrap();
    let w0 = start2();
    let w = Parameter::new("w", &ctx.from_vec(w0[..6].to_vec(), &[2, 3]).unwrap()).unwrap();
    let b = Parameter::new("b", &ctx.from_vec(w0[6..].to_vec(), &[3]).unwrap()).unwrap();
    let mut opt = make(&[w.clone(), b.clone()]);
    (0..STEPS)
        .map(|t| {
            let g: Vec<f64> = (0..9).map(|i| grad2(t, i)).collect();
            let gw = ctx.from_vec(g[..6].to_vec(), &[2, 3]).unwrap();
            let gb = ctx.from_vec(g[6..].to_vec(), &[3]).unwrap();
            opt.step(&[gw, gb]).unwrap();
            let mut v = w.array().unwrap().to_vec::<f64>().unwrap();
            v.extend(b.array().unwrap().to_vec::<f64>().unwrap());
            v
        })
        .collect()
}

fn start2() -> Vec<f64> {
    vec![0.5, -1.25, 2.0, 0.0, -0.75, 1.5, 0.25, -0.5, 1.0]
}

/// torch's `clip_grad_norm_` then AdamW (torch.optim.AdamW docs) with weight decay on
/// the first `decayed` elements only (nanoGPT's parameter groups).
fn clipped_adamw_reference(lr: f64, wd: f64, decayed: usize, max_norm: f64) -> Vec<Vec<f64>> {
    let (b1, b2, eps) = (0.9, 0.999, 1e-8);
    let mut w = start2();
    let (mut m, mut v) = (vec![0.0; 9], vec![0.0; 9]);
    (0..STEPS)
        .map(|t| {
            let n = (t + 1) as i32;
            let g: Vec<f64> = (0..9).map(|i| grad2(t, i)).collect();
            let total = g.iter().map(|x| x * x).sum::<f64>().sqrt();
            let coef = (max_norm / (total + 1e-6)).min(1.0);
            for i in 0..9 {
                let g = g[i] * coef;
                if i < decayed {
                    w[i] *= 1.0 - lr * wd;
                }
                m[i] = b1 * m[i] + (1.0 - b1) * g;
                v[i] = b2 * v[i] + (1.0 - b2) * g * g;
                let mh = m[i] / (1.0 - b1.powi(n));
                let vh = v[i] / (1.0 - b2.powi(n));
                w[i] -= lr * mh / (vh.sqrt() + eps);
            }
            w.clone()
        })
        .collect()
}

#[test]
fn adamw_with_a_decay_mask_and_gradient_clipping_matches_the_textbook() {
    // Decay on the matrix only (rank >= 2), clipped to norm 1: the odd steps' gradients
    // (norm ~ 9) are scaled down, the even steps' (norm ~ 0.15) are not.
    assert_close(
        &run2(|p| {
            Optimizer::adamw(p, 0.01, 0.1)
                .no_decay(|p| p.shape().len() < 2)
                .clip_grad_norm(1.0)
        }),
        &clipped_adamw_reference(0.01, 0.1, 6, 1.0),
        "adamw, decay mask, clipping",
    );
    // Without the mask every parameter decays; a norm no step reaches clips nothing.
    assert_close(
        &run2(|p| Optimizer::adamw(p, 0.01, 0.1).clip_grad_norm(1e9)),
        &clipped_adamw_reference(0.01, 0.1, 9, 1e9),
        "adamw, no mask, no clipping",
    );
    let ctx = Context::new();
    let p = Parameter::new("p", &ctx.ones(&[2])).unwrap();
    let q = Parameter::new("q", &ctx.ones(&[2, 2])).unwrap();
    let opt = Optimizer::sgd(&[p, q], 0.1)
        .no_decay(|p| p.name() == "p")
        .momentum(0.9);
    // Rebuilding the state for momentum keeps the mask.
    assert_eq!(opt.decays(), &[false, true]);
}

#[test]
fn clip_grad_norm_scales_by_the_global_norm() {
    let ctx = Context::new();
    let g = [
        ctx.from_vec(vec![3.0f32, 0.0], &[2]).unwrap(),
        ctx.from_vec(vec![0.0f32, 4.0, 0.0, 0.0], &[2, 2]).unwrap(),
    ];
    let (clipped, total) = ndfuse_nn::clip_grad_norm(&g, 2.0);
    assert_eq!(total.eval().unwrap().to_vec::<f32>().unwrap(), vec![5.0]);
    // Scaled by 2 / (5 + 1e-6): f32 rounding of that factor.
    let c0 = clipped[0].eval().unwrap().to_vec::<f32>().unwrap();
    let c1 = clipped[1].eval().unwrap().to_vec::<f32>().unwrap();
    assert!(
        (c0[0] - 1.2).abs() < 1e-6 && (c1[1] - 1.6).abs() < 1e-6,
        "{c0:?} {c1:?}"
    );
    // Under the norm: unchanged (the factor is exactly 1).
    let (same, _) = ndfuse_nn::clip_grad_norm(&g, 10.0);
    assert_eq!(
        same[1].eval().unwrap().to_vec::<f32>().unwrap(),
        vec![0.0, 4.0, 0.0, 0.0]
    );
}

#[test]
fn a_clipped_step_compiles_once() {
    let ctx = Context::new();
    let params: Vec<Parameter> = [&[8usize, 4][..], &[4]]
        .iter()
        .enumerate()
        .map(|(i, s)| {
            Parameter::new(format!("p{i}"), &ctx.rand_normal(s, 0.0, 1.0, i as u64)).unwrap()
        })
        .collect();
    let mut opt = Optimizer::adamw(&params, 1e-3, 0.1)
        .no_decay(|p| p.shape().len() < 2)
        .clip_grad_norm(0.5);
    let grads: Vec<Tensor> = params
        .iter()
        .enumerate()
        .map(|(i, p)| ctx.rand_normal(&p.shape(), 0.0, 1.0, 20 + i as u64))
        .collect();
    opt.step(&grads).unwrap();
    let update = opt.update(&grads).unwrap();
    let outputs: Vec<&Tensor> = update.params.iter().chain(&update.state).collect();
    let (_, report) = ctx.eval_report(&outputs).unwrap();
    assert!(report.evaluation().compile_cached, "step 2 recompiled");
}
