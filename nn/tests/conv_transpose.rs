//! Issue 36: `ConvTranspose2d` in a `Sequential` trains: a small convolutional
//! autoencoder (conv stride 2 down, transposed conv stride 2 up) halves its
//! reconstruction loss on fixed images within 60 Adam steps, and the layer survives
//! duplication (data parallelism) with its own parameters.

use ndfuse::{Array, Context, Conv};
use ndfuse_nn::{
    Activation, Conv2d, ConvTranspose2d, Init, Layer, Loss, Optimizer, Sequential, Trainer,
};

#[test]
fn a_convolutional_autoencoder_with_conv_transpose2d_learns() {
    let ctx = Context::new();
    let model = Sequential::new()
        .push(
            Conv2d::new(
                &ctx,
                "down",
                1,
                8,
                3,
                Conv::new().stride(2).padding(1),
                Init::HeUniform,
                1,
            )
            .unwrap(),
        )
        .push(Activation::Relu)
        .push(
            ConvTranspose2d::new(
                &ctx,
                "up",
                8,
                1,
                3,
                Conv::new().stride(2).padding(1).output_padding(1),
                Init::GlorotUniform,
                2,
            )
            .unwrap(),
        );
    assert_eq!(model.parameters().len(), 4);
    assert_eq!(model.duplicate().parameters().len(), 4);
    // Smooth 12x12 images: sums of two slopes.
    let images: Vec<f32> = (0..16 * 144)
        .map(|i| {
            let (b, y, x) = (i / 144, (i % 144) / 12, i % 12);
            ((b % 4) as f32 * x as f32 + (b / 4) as f32 * y as f32) / 40.0
        })
        .collect();
    let x = Array::from_vec(images, &[16, 1, 12, 12]).unwrap();
    let opt = Optimizer::adam(&model.parameters(), 1e-2);
    let mut t = Trainer::new(model, opt, Loss::Mse).unwrap();
    let first = t.step(&x, &x).unwrap();
    let mut last = first;
    for _ in 0..60 {
        last = t.step(&x, &x).unwrap();
    }
    assert!(
        last.is_finite() && last < first / 2.0,
        "loss {first} -> {last}"
    );
}
