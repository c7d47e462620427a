//! What the data-set tests share.

use ndfuse_nn::FashionMnist;
use std::path::Path;

/// Fashion-MNIST from Debian's `dataset-fashion-mnist`, or `None` with the reason
/// printed where it is not installed; with `NDFUSE_REQUIRE_DATA=1` (as CI sets) a
/// missing data set fails the test instead.
pub fn fashion_mnist() -> Option<FashionMnist> {
    let dir = Path::new(FashionMnist::DIR);
    if !FashionMnist::present(dir) {
        assert!(
            std::env::var("NDFUSE_REQUIRE_DATA").as_deref() != Ok("1"),
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
