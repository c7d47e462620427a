//! Issue 36: the `Conv1d` layer over sequences `[N, C, L]`: its forward pass is the
//! functional `conv1d` with its own weight and bias, it learns a filter in a
//! `Sequential` (a moving average of a signal, fitted to a hundredth of the first
//! loss), it refuses groups that do not divide the channels, and a duplicate has
//! parameters of its own.

use ndfuse::{Array, Context, Conv};
use ndfuse_nn::{Conv1d, Init, Layer, Loss, Mode, Optimizer, Sequential, Trainer};

#[test]
fn conv1d_is_the_functional_convolution_with_its_parameters() {
    let ctx = Context::new();
    let conv = Conv::new().stride(2).padding(2).dilation(2).groups(2);
    let layer = Conv1d::new(&ctx, "c", 4, 6, 3, conv.clone(), Init::HeUniform, 7).unwrap();
    assert_eq!(layer.weight().shape(), vec![6, 2, 3]);
    let x = ctx.rand_normal(&[3, 4, 17], 0.0, 1.0, 1);
    let y = layer.forward(&x, &Mode::eval());
    let b = layer.bias().unwrap().value() + 0.5;
    layer.bias().unwrap().replace(b.eval().unwrap()).unwrap();
    let y = layer.forward(&x, &Mode::eval()) - y;
    let want = x.conv1d(
        &layer.weight().value(),
        Some(&layer.bias().unwrap().value()),
        &conv,
    ) - x.conv1d(&layer.weight().value(), None, &conv);
    let (got, want) = (y.eval().unwrap(), want.eval().unwrap());
    assert_eq!(got.shape(), &[3, 6, 9]);
    for (g, w) in got.to_f64_vec().iter().zip(want.to_f64_vec()) {
        assert!(
            (g - 0.5).abs() < 1e-6 && (w - 0.5).abs() < 1e-6,
            "{g} vs {w}"
        );
    }
    let whole = layer.forward(&x, &Mode::eval()).eval().unwrap();
    let functional = x
        .conv1d(
            &layer.weight().value(),
            Some(&layer.bias().unwrap().value()),
            &conv,
        )
        .eval()
        .unwrap();
    assert_eq!(whole.to_f64_vec(), functional.to_f64_vec());
}

#[test]
fn conv1d_learns_a_moving_average() {
    let ctx = Context::new();
    // 8 rough signals of 64 steps (every tap matters); the target is their 5-tap
    // moving average ('same' zeros).
    let signal: Vec<f32> = (0..8 * 64)
        .map(|i| ((i * 7919 + 13) % 101) as f32 / 50.0 - 1.0)
        .collect();
    let target: Vec<f32> = (0..8 * 64)
        .map(|i| {
            let (s, t) = (i / 64, (i % 64) as i64);
            (t - 2..=t + 2)
                .filter(|u| (0..64).contains(u))
                .map(|u| signal[s * 64 + u as usize])
                .sum::<f32>()
                / 5.0
        })
        .collect();
    let x = Array::from_vec(signal, &[8, 1, 64]).unwrap();
    let y = Array::from_vec(target, &[8, 1, 64]).unwrap();
    let same = Conv::new().padding("same");
    let model = Sequential::new()
        .push(Conv1d::new(&ctx, "avg", 1, 1, 5, same, Init::HeUniform, 3).unwrap());
    let opt = Optimizer::adam(&model.parameters(), 5e-2);
    let mut t = Trainer::new(model, opt, Loss::Mse).unwrap();
    let first = t.step(&x, &y).unwrap();
    let mut last = first;
    for _ in 0..200 {
        last = t.step(&x, &y).unwrap();
    }
    assert!(
        last.is_finite() && last < first / 100.0,
        "loss {first} -> {last}"
    );
    let w = t.model().parameters()[0].array().unwrap().to_f64_vec();
    for tap in w {
        assert!(
            (tap - 0.2).abs() < 0.05,
            "a learned tap {tap}, the filter's 0.2"
        );
    }
}

#[test]
fn conv1d_refuses_groups_that_do_not_divide_the_channels() {
    let ctx = Context::new();
    let err = Conv1d::new(
        &ctx,
        "c",
        3,
        4,
        3,
        Conv::new().groups(2),
        Init::HeUniform,
        1,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("Conv1d::new") && err.contains("groups = 2"),
        "{err}"
    );
    let layer = Conv1d::new(&ctx, "c", 2, 2, 3, Conv::new(), Init::HeUniform, 1).unwrap();
    let copy = layer.duplicate();
    assert_eq!(copy.parameters().len(), 2);
    assert!(!copy.parameters()[0].same(layer.weight()));
}
