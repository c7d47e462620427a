//! What the data-set tests share. Each test binary uses some of these, hence the
//! `dead_code` allowances.

use ndfuse_nn::{CharCorpus, FashionMnist};
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
