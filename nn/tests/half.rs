//! Mixed-precision training: in a bf16 or f16 context parameters and optimiser state
//! are f32 master copies while the model computes in the half dtype; a tiny GPT trains
//! in bf16 and in f16 close to its f32 curve; f16's dynamic loss scaling keeps
//! gradients that f16 would flush to zero (against a host reference), skips a step
//! whose gradients overflow (counted, parameters and state bit for bit unchanged, the
//! step count not advanced), halves the scale then and doubles it after the growth
//! interval, and survives a checkpoint.

mod support;

use ndfuse::{f16, Context, DType, Tensor};
use ndfuse_nn::{
    epoch_line, Activation, Dataset, FitOptions, Gpt, Layer, Loss, LossScale, Mode, Optimizer,
    Parameter, Sequential, Trainer,
};
use std::path::PathBuf;
use support::{tiny_batch, tiny_config, tiny_optimizer};

fn half_context(dtype: DType) -> Context {
    Context::builder().dtype(dtype).build().unwrap()
}

fn tiny_trainer(ctx: &Context) -> Trainer<Gpt> {
    tiny_trainer_with(ctx, |opt| opt)
}

/// The tiny GPT's trainer with its optimiser changed by `f`.
fn tiny_trainer_with(ctx: &Context, f: impl FnOnce(Optimizer) -> Optimizer) -> Trainer<Gpt> {
    let model = Gpt::new(ctx, &tiny_config()).unwrap();
    let opt = tiny_optimizer(&model);
    Trainer::new(model, f(opt), Loss::CrossEntropy)
        .unwrap()
        .seed(5)
}

fn curve(t: &mut Trainer<Gpt>, steps: std::ops::Range<u64>) -> Vec<f64> {
    steps
        .map(|s| {
            let (x, y) = tiny_batch(s);
            t.step(&x, &y).unwrap()
        })
        .collect()
}

/// Every parameter's and every state tensor's bits.
fn bits<M: Layer>(t: &Trainer<M>) -> Vec<Vec<u32>> {
    let params = t.optimizer().parameters().iter().map(Parameter::value);
    let state = t.optimizer().state().into_iter().map(|(_, v)| v);
    params
        .chain(state)
        .map(|v: Tensor| {
            let a = v.eval().unwrap();
            a.to_vec::<f32>()
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect()
        })
        .collect()
}

/// The tolerance between a half-precision and the f32 curve of the tiny GPT, relative,
/// per step: bf16 keeps 8 bits of mantissa in the activations (a rounding of 2^-9 per
/// op, some of it carried through 20 updates), f16 11 bits. Measured: 5.0e-3 (bf16)
/// and 6.2e-4 (f16) at most over the 20 steps; the tolerances leave a factor of 4 and 8.
fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => 0.02,
        _ => 0.005,
    }
}

#[test]
fn a_half_context_keeps_f32_master_weights_drawn_as_f32_draws_them() {
    let f32_model = Gpt::new(&Context::new(), &tiny_config()).unwrap();
    for dtype in [DType::BF16, DType::F16] {
        let ctx = half_context(dtype);
        let model = Gpt::new(&ctx, &tiny_config()).unwrap();
        for (p, q) in model.parameters().iter().zip(f32_model.parameters()) {
            assert_eq!(p.dtype(), DType::F32, "{dtype}: {}", p.name());
            // The same draws as an f32 context: not f32 values of half draws.
            let (a, b) = (p.array().unwrap(), q.array().unwrap());
            assert_eq!(
                a.to_vec::<f32>().unwrap(),
                b.to_vec::<f32>().unwrap(),
                "{dtype}: {}",
                p.name()
            );
        }
        // The model computes in the half dtype.
        let (x, _) = tiny_batch(0);
        let logits = model.forward(&ctx.tensor(x), &Mode::eval());
        assert_eq!(logits.dtype().unwrap(), dtype);
        // A half value made a parameter explicitly stays half.
        let h = Parameter::exact("h", &ctx.ones(&[2])).unwrap();
        assert_eq!(h.dtype(), dtype);
        assert_eq!(Parameter::master_dtype(&ctx), DType::F32);
    }
    // Other contexts are untouched: an f64 context keeps f64 parameters.
    let ctx = half_context(DType::F64);
    let w = Parameter::new("w", &ctx.ones(&[2])).unwrap();
    assert_eq!(w.dtype(), DType::F64);
}

#[test]
fn a_tiny_gpt_trains_in_bf16_and_f16_close_to_its_f32_curve() {
    let reference = curve(&mut tiny_trainer(&Context::new()), 0..20);
    for dtype in [DType::BF16, DType::F16] {
        let ctx = half_context(dtype);
        let mut t = tiny_trainer(&ctx);
        // Loss scaling in f16 only: bf16 has f32's exponent range.
        assert_eq!(t.optimizer().loss_scaler().is_some(), dtype == DType::F16);
        let losses = curve(&mut t, 0..20);
        assert!(
            losses[19] < 0.6 * losses[0],
            "{dtype}: 20 AdamW steps: {losses:?}"
        );
        let tol = tolerance(dtype);
        let worst = losses
            .iter()
            .zip(&reference)
            .map(|(a, b)| (a - b).abs() / b.abs())
            .fold(0.0, f64::max);
        println!("{dtype}: largest relative difference from f32 {worst:.2e} (tolerance {tol})");
        for (i, (a, b)) in losses.iter().zip(&reference).enumerate() {
            assert!(
                (a - b).abs() <= tol * b.abs(),
                "{dtype} step {i}: {a} vs f32 {b} (tolerance {tol} relative)\n{losses:?}\n{reference:?}"
            );
        }
        // The master copies and the moments stayed f32.
        assert!(t
            .optimizer()
            .parameters()
            .iter()
            .all(|p| p.dtype() == DType::F32));
        for (name, s) in t.optimizer().state() {
            assert_eq!(s.dtype().unwrap(), DType::F32, "{name}");
        }
        // Nothing overflowed at the default scale in this small model.
        assert_eq!(t.optimizer().skipped_steps(), 0, "{dtype}");
        assert_eq!(t.optimizer().steps(), 20);
    }
}

#[test]
fn an_overflowing_f16_step_is_skipped_counted_and_changes_nothing() {
    let ctx = half_context(DType::F16);
    let mut t = tiny_trainer(&ctx);
    let mut straight = tiny_trainer(&ctx);
    curve(&mut t, 0..3);
    curve(&mut straight, 0..3);
    let before = bits(&t);
    // A scale so large that the loss's gradient overflows f16 in the backward pass.
    let huge = 2f64.powi(100);
    t.optimizer_mut()
        .loss_scaler_mut()
        .unwrap()
        .set_scale(huge)
        .unwrap();
    let (x, y) = tiny_batch(3);
    let loss = t.step(&x, &y).unwrap();
    // The forward pass is unscaled: its loss is the batch's, finite.
    assert!(loss.is_finite(), "{loss}");
    let opt = t.optimizer();
    assert_eq!(opt.skipped_steps(), 1);
    assert_eq!(opt.loss_scale(), huge / 2.0, "the scale halves");
    assert_eq!(opt.steps(), 3, "a skipped step does not count");
    assert_eq!(bits(&t), before, "parameters and state bit for bit");
    // At a sane scale again the next step is the step a run without the overflow took:
    // same step count (bias corrections, schedule, dropout key), same values.
    let scale = straight.optimizer().loss_scale();
    t.optimizer_mut()
        .loss_scaler_mut()
        .unwrap()
        .set_scale(scale)
        .unwrap();
    let (a, b) = (curve(&mut t, 3..5), curve(&mut straight, 3..5));
    assert_eq!(a, b);
    assert_eq!(bits(&t), bits(&straight));
    assert_eq!(t.optimizer().skipped_steps(), 1);
}

#[test]
fn the_scale_halves_on_overflow_and_doubles_after_the_growth_interval() {
    let ctx = half_context(DType::F16);
    let mut t = tiny_trainer_with(&ctx, |o| {
        o.with_loss_scale(Some(LossScale::new().growth_interval(3)))
    });
    let start = LossScale::INITIAL;
    let huge = 2f64.powi(100);
    let set = |t: &mut Trainer<Gpt>, scale: f64| {
        let s = t.optimizer_mut().loss_scaler_mut().unwrap();
        s.set_scale(scale).unwrap();
    };
    let mut scales = Vec::new();
    for s in 0..9u64 {
        match s {
            // Overflow the step after the growth: halved, counted.
            4 => set(&mut t, huge),
            // Back to a sane scale: the count of finite steps starts again.
            5 => set(&mut t, start),
            _ => {}
        }
        let (x, y) = tiny_batch(s);
        t.step(&x, &y).unwrap();
        scales.push(t.optimizer().loss_scale());
    }
    let s2 = 2.0 * start;
    assert_eq!(
        scales,
        // Three finite steps: doubled; the overflow: halved; three more: doubled.
        vec![start, start, s2, s2, huge / 2.0, start, start, s2, s2]
    );
    assert_eq!(t.optimizer().skipped_steps(), 1);
    assert_eq!(t.optimizer().steps(), 8);
    assert_eq!(t.optimizer().loss_scaler().unwrap().good_steps(), 1);
}

/// GradScaler's rule written out: (scale, growth tracker, skipped) after each outcome.
/// The scale is capped at 2^127 (GradScaler's f32 scale would become infinite there).
fn grad_scaler(outcomes: &[bool], interval: u64) -> Vec<(f64, u64, u64)> {
    let (mut scale, mut tracker, mut skipped) = (65536.0f64, 0, 0);
    outcomes
        .iter()
        .map(|&finite| {
            if finite {
                tracker += 1;
                if tracker == interval {
                    scale = (scale * 2.0).min(2f64.powi(127));
                    tracker = 0;
                }
            } else {
                scale *= 0.5;
                tracker = 0;
                skipped += 1;
            }
            (scale, tracker, skipped)
        })
        .collect()
}

#[test]
fn the_loss_scale_follows_grad_scalers_rule() {
    // Overflows now and then, runs of finite steps between them, and a run long enough
    // to reach the cap with an interval of 1.
    let outcomes: Vec<bool> = (0..400u64)
        .map(|i| i >= 200 || (i * 2_654_435_761) % 5 != 0 || i % 11 == 0)
        .collect();
    for interval in [1, 2, 5] {
        let mut s = LossScale::new().growth_interval(interval);
        let got: Vec<(f64, u64, u64)> = outcomes
            .iter()
            .map(|&f| {
                s.record(f);
                (s.scale(), s.good_steps(), s.skipped_steps())
            })
            .collect();
        assert_eq!(got, grad_scaler(&outcomes, interval), "interval {interval}");
    }
    let mut s = LossScale::new();
    assert!(s.set_scale(0.0).is_err());
    assert!(s.set_scale(f64::INFINITY).is_err());
    assert!(s.set_scale(f64::NAN).is_err());
    assert_eq!(s.scale(), 65536.0, "a refused scale changes nothing");
    // Bounded: the scale stays a finite, normal f32.
    s.set_scale(LossScale::MAX).unwrap();
    s = s.growth_interval(1);
    s.record(true);
    assert_eq!(s.scale(), LossScale::MAX);
    s.set_scale(LossScale::MIN).unwrap();
    s.record(false);
    assert_eq!(s.scale(), LossScale::MIN);
}

#[test]
fn loss_scaling_keeps_gradients_f16_would_flush_to_zero() {
    // loss = 1e-8 * sum(w * x), computed in f16 and widened: the gradient of the f16
    // sum is 1e-8, below f16's smallest subnormal (6e-8), so unscaled it rounds to 0;
    // scaled by 2^16 it is 6.6e-4, and w's gradient comes back as 1e-8 * x.
    let ctx = half_context(DType::F16);
    let xs = [1.0f32, 2.0, 0.5, -3.0];
    let x = ctx
        .from_vec(xs.iter().map(|&v| f16::from_f32(v)).collect(), &[4])
        .unwrap();
    let w = Parameter::new("w", &ctx.from_vec(vec![1.0f32; 4], &[4]).unwrap()).unwrap();
    let loss = (&w.value_like(&x) * &x).sum(..).cast(DType::F32) * 1e-8;
    let grad = |opt: &Optimizer| {
        let g = opt.gradients(&loss, &[&w.value()]).unwrap();
        let leaves: Vec<&str> = g.scalars.iter().map(|s| s.1).collect();
        (g.grads[0].eval().unwrap().to_f64_vec(), leaves)
    };
    let scaled = Optimizer::sgd(std::slice::from_ref(&w), 1.0);
    assert_eq!(scaled.loss_scale(), 65536.0);
    let (g, leaves) = grad(&scaled);
    assert_eq!(leaves, ["loss_scale", "inv_loss_scale"]);
    for (got, &x) in g.iter().zip(&xs) {
        let want = 1e-8 * f64::from(x);
        // Two f16 roundings (the scaled 1e-8, the product with x): 2^-11 each.
        assert!(
            (got - want).abs() <= 1.5e-3 * want.abs(),
            "{got} vs host {want}"
        );
    }
    let (g, leaves) = grad(&Optimizer::sgd(std::slice::from_ref(&w), 1.0).with_loss_scale(None));
    assert!(leaves.is_empty());
    assert_eq!(
        g,
        vec![0.0; 4],
        "unscaled, f16 flushes the gradient to zero"
    );
    // The SGD step on the scaled gradient is the host's w - 1e6 * 1e-8 * x.
    let mut opt = Optimizer::sgd(std::slice::from_ref(&w), 1e6);
    let g = opt.gradients(&loss, &[&w.value()]).unwrap();
    opt.step(&g.grads).unwrap();
    let got = w.array().unwrap().to_f64_vec();
    for (got, &x) in got.iter().zip(&xs) {
        let want = 1.0 - 1e-2 * f64::from(x);
        assert!((got - want).abs() <= 2e-5, "{got} vs host {want}");
    }
    // A non-finite gradient: Optimizer::step skips, counts and leaves w as it was.
    let was = w.array().unwrap().to_f64_vec();
    let inf = ctx
        .from_vec(vec![f32::INFINITY, 0.0, 0.0, 0.0], &[4])
        .unwrap();
    opt.step(&[inf]).unwrap();
    assert_eq!(w.array().unwrap().to_f64_vec(), was);
    assert_eq!((opt.skipped_steps(), opt.steps()), (1, 1));
    let nan = ctx.from_vec(vec![0.0, f32::NAN, 0.0, 0.0], &[4]).unwrap();
    opt.step(&[nan]).unwrap();
    assert_eq!(w.array().unwrap().to_f64_vec(), was);
    assert_eq!((opt.skipped_steps(), opt.steps()), (2, 1));
    assert_eq!(opt.loss_scale(), 16384.0);
}

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ndfuse-nn-half-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn a_checkpoint_keeps_the_loss_scale_and_the_skipped_steps() {
    let ctx = half_context(DType::F16);
    let mut t = tiny_trainer(&ctx);
    curve(&mut t, 0..2);
    let scaler = t.optimizer_mut().loss_scaler_mut().unwrap();
    scaler.set_scale(2f64.powi(90)).unwrap();
    curve(&mut t, 2..3); // skipped: 2^89
    let path = temp("scaled.safetensors");
    t.save(&path).unwrap();
    let mut resumed = tiny_trainer(&ctx);
    resumed.load(&path).unwrap();
    let (a, b) = (t.optimizer(), resumed.optimizer());
    assert_eq!(b.loss_scale(), 2f64.powi(89));
    assert_eq!((b.skipped_steps(), b.steps()), (1, 2));
    assert_eq!(a.loss_scaler(), b.loss_scaler());
    std::fs::remove_file(&path).ok();
}

#[test]
fn an_mlp_fits_in_half_precision_from_f32_data_and_reports_the_scale() {
    for dtype in [DType::BF16, DType::F16] {
        let ctx = half_context(dtype);
        // f32 data: the first Linear casts it to the context's dtype (autocast).
        let x = Context::new()
            .rand_normal(&[64, 4], 0.0, 1.0, 1)
            .eval()
            .unwrap();
        let y = Context::new()
            .tensor(x.clone())
            .sum_keepdims(1)
            .eval()
            .unwrap();
        assert_eq!(x.dtype(), DType::F32);
        let data = Dataset::new(x, y).unwrap();
        let model = Sequential::mlp(&ctx, &[4, 16, 1], Activation::Tanh, 2).unwrap();
        let out = model.forward(&ctx.tensor(data.features().clone()), &Mode::eval());
        assert_eq!(out.dtype().unwrap(), dtype);
        let opt = Optimizer::adam(&model.parameters(), 0.02);
        let mut t = Trainer::new(model, opt, Loss::Mse).unwrap();
        let opts = FitOptions {
            epochs: 8,
            batch_size: 16,
            progress: false,
            ..FitOptions::default()
        };
        let h = t.fit(&data, Some(&data), &opts).unwrap();
        let (first, last) = (&h.epochs[0], &h.epochs[7]);
        assert!(
            last.validation.unwrap().loss < 0.3 * first.train_loss,
            "{dtype}: {first:?} -> {last:?}"
        );
        let line = epoch_line(last);
        if dtype == DType::F16 {
            // An MSE gradient 2^16 times larger can overflow f16 at first: skipped
            // steps are counted per epoch, and the line ends with the scale.
            let opt = t.optimizer();
            assert_eq!(last.loss_scale, Some(opt.loss_scale()));
            let skipped: u64 = h.epochs.iter().map(|e| e.skipped_steps).sum();
            assert_eq!(skipped, opt.skipped_steps());
            let log = opt.loss_scale().log2();
            let tail = format!("scale 2^{log}, {} skipped", last.skipped_steps);
            assert!(line.ends_with(&tail), "{line}");
            println!("f16 MLP: {skipped} steps skipped; {line}");
        } else {
            assert_eq!(last.loss_scale, None);
            assert!(!line.contains("scale"), "{line}");
        }
    }
}
