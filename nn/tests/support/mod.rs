//! What the data-set tests share. Each test binary uses some of these, hence the
//! `dead_code` allowances.

use ndfuse::Array;
use ndfuse_nn::{CharCorpus, FashionMnist, Gpt, GptConfig, Layer, Optimizer, Schedule};
use std::path::Path;

/// Whether a missing data set fails the test (`NDFUSE_REQUIRE_DATA=1`, as CI sets)
/// instead of skipping it.
fn required() -> bool {
    std::env::var("NDFUSE_REQUIRE_DATA").as_deref() == Ok("1")
}

/// Fashion-MNIST from Debian's `dataset-fashion-mnist`, or `None` with the reason
/// printed where it is not installed; with `NDFUSE_REQUIRE_DATA=1` (as CI sets) a
/// missing data set fails the test instead.
#[allow(dead_code)]
pub fn fashion_mnist() -> Option<FashionMnist> {
    let dir = Path::new(FashionMnist::DIR);
    if !FashionMnist::present(dir) {
        assert!(
            !required(),
            "NDFUSE_REQUIRE_DATA=1 but Fashion-MNIST is not in {} (apt install dataset-fashion-mnist)",
            dir.display()
        );
        println!(
            "skipped: Fashion-MNIST is not in {} (Debian's dataset-fashion-mnist)",
            dir.display()
        );
        return None;
    }
    Some(FashionMnist::load(dir).expect("Fashion-MNIST"))
}

/// The fortunes corpus from Debian's `fortunes`, or `None` with the reason printed
/// where it is not installed; with `NDFUSE_REQUIRE_DATA=1` a missing corpus fails the
/// test instead.
#[allow(dead_code)]
pub fn fortunes() -> Option<CharCorpus> {
    let dir = Path::new(CharCorpus::FORTUNES_DIR);
    if !CharCorpus::present(dir) {
        assert!(
            !required(),
            "NDFUSE_REQUIRE_DATA=1 but the fortunes corpus is not in {} (apt install fortunes)",
            dir.display()
        );
        println!(
            "skipped: the fortunes corpus is not in {} (Debian's fortunes)",
            dir.display()
        );
        return None;
    }
    Some(CharCorpus::fortunes(dir).expect("the fortunes corpus"))
}

/// The tiny GPT of the transformer and half-precision tests: vocabulary 16, context 8,
/// d_model 32, 2 blocks of 4 heads.
#[allow(dead_code)]
pub fn tiny_config() -> GptConfig {
    GptConfig {
        seed: 3,
        ..GptConfig::new(16, 8, 32, 2, 4)
    }
}

/// A learnable next-token rule for [`tiny_config`]'s model: each of 4 rows of 8 counts
/// up by a stride from its own start.
#[allow(dead_code)]
pub fn tiny_batch(step: u64) -> (Array, Array) {
    let (b, t) = (4usize, 8usize);
    let mut x = Vec::new();
    let mut y = Vec::new();
    for r in 0..b as u64 {
        let start = (step * 5 + r * 3) % 16;
        let stride = 1 + r % 3;
        for i in 0..t as u64 {
            x.push(((start + i * stride) % 16) as i64);
            y.push(((start + (i + 1) * stride) % 16) as i64);
        }
    }
    (
        Array::from_vec(x, &[b, t]).unwrap(),
        Array::from_vec(y, &[b, t]).unwrap(),
    )
}

/// The tiny GPT's recipe: AdamW 1e-2 (betas 0.9, 0.99; decay 0.1 on matrices only),
/// clipping at 1, cosine to 1e-3 over 30 steps after 3 of warm-up.
#[allow(dead_code)]
pub fn tiny_optimizer(model: &Gpt) -> Optimizer {
    Optimizer::adamw(&model.parameters(), 1e-2, 0.1)
        .betas(0.9, 0.99)
        .no_decay(|p| p.shape().len() < 2)
        .clip_grad_norm(1.0)
        .schedule(
            Schedule::Cosine {
                base: 1e-2,
                floor: 1e-3,
                steps: 30,
            }
            .with_warmup(3),
        )
}
