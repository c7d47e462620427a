//! The CNN layers, and the CNN learning Fashion-MNIST (Debian's
//! `dataset-fashion-mnist`; required with `NDFUSE_REQUIRE_DATA=1`, as CI sets, skipped
//! with a printed reason elsewhere): a short run of `train_fashion`'s model and recipe.

use ndfuse::{Context, Conv, Pool};
use ndfuse_nn::{
    Activation, Conv2d, FitOptions, Flatten, GlobalAvgPool, Init, Layer, Linear, Loss, MaxPool2d,
    Mode, Optimizer, Sequential, Trainer,
};

mod support;

#[test]
fn conv_layers_have_pytorchs_shapes_and_parameters() {
    let ctx = Context::new();
    let c = Conv2d::new(
        &ctx,
        "c",
        4,
        6,
        (3, 2),
        Conv::new().padding(1).groups(2),
        Init::HeUniform,
        7,
    )
    .expect("a layer");
    let names: Vec<String> = c
        .parameters()
        .iter()
        .map(|p| p.name().to_string())
        .collect();
    assert_eq!(names, ["c.weight", "c.bias"]);
    assert_eq!(c.weight().value().shape().expect("w"), &[6, 2, 3, 2]);
    let x = ctx.ones(&[2, 4, 5, 5]);
    let y = c.forward(&x, &Mode::eval());
    assert_eq!(y.shape().expect("y"), &[2, 6, 5, 6]);
    // He-uniform over fan_in = 2 * 3 * 2: every weight within sqrt(6 / 12).
    let w = c.weight().value().eval().expect("w").to_f64_vec();
    assert!(w.iter().all(|v| v.abs() <= (0.5f64).sqrt()), "{w:?}");
    // A replica has parameters of its own with the same values.
    let d = c.duplicate();
    assert!(!d.parameters()[0].same(&c.parameters()[0]));
    assert_eq!(d.parameters()[0].value().eval().expect("w").to_f64_vec(), w);
    let err = Conv2d::new(
        &ctx,
        "c",
        4,
        6,
        3,
        Conv::new().groups(4),
        Init::HeUniform,
        7,
    )
    .expect_err("4 groups of 6 outputs");
    assert!(err.to_string().contains("groups = 4 must divide"), "{err}");

    let net = Sequential::new()
        .push(MaxPool2d(Pool::new(2)))
        .push(GlobalAvgPool)
        .push(Flatten);
    assert_eq!(
        net.forward(&ctx.ones(&[3, 5, 8, 8]), &Mode::eval())
            .shape()
            .expect("y"),
        &[3, 5]
    );
}

/// `train_fashion`'s model and recipe (Adam 1e-3, batch 128) on the first 1024
/// training images for one epoch (8 steps), scored on the first 1000 test images:
/// well above chance (10%); a full run reaches about 91% (bench/RESULTS.md).
#[test]
fn the_cnn_learns_fashion_mnist() {
    let Some(data) = support::fashion_mnist() else {
        return;
    };
    let train = data
        .train
        .subset(&(0..1024).collect::<Vec<_>>())
        .expect("a subset");
    let test = data
        .test
        .subset(&(0..1000).collect::<Vec<_>>())
        .expect("a subset");
    let ctx = Context::new();
    let same = || Conv::new().padding(1);
    let model = Sequential::new()
        .push(Conv2d::new(&ctx, "conv1", 1, 32, 3, same(), Init::HeUniform, 1).expect("conv1"))
        .push(Activation::Relu)
        .push(MaxPool2d(Pool::new(2)))
        .push(Conv2d::new(&ctx, "conv2", 32, 64, 3, same(), Init::HeUniform, 2).expect("conv2"))
        .push(Activation::Relu)
        .push(MaxPool2d(Pool::new(2)))
        .push(Flatten)
        .push(Linear::new(&ctx, "fc1", 64 * 7 * 7, 128, Init::HeUniform, 3).expect("fc1"))
        .push(Activation::Relu)
        .push(Linear::new(&ctx, "fc2", 128, 10, Init::GlorotUniform, 4).expect("fc2"));
    let opt = Optimizer::adam(&model.parameters(), 1e-3);
    let mut trainer = Trainer::new(model, opt, Loss::CrossEntropy).expect("a trainer");
    let opts = FitOptions {
        epochs: 1,
        batch_size: 128,
        eval_batch: 500,
        seed: 1,
        progress: false,
        ..FitOptions::default()
    };
    let history = trainer.fit(&train, Some(&test), &opts).expect("training");
    let losses = &history.step_losses;
    assert_eq!(losses.len(), 8);
    assert!(losses[7] < losses[0] * 0.8, "the loss falls: {losses:?}");
    let acc = history.epochs[0]
        .validation
        .and_then(|v| v.accuracy)
        .expect("an accuracy");
    assert!(acc > 0.5, "test accuracy {acc} after 8 steps");
}
