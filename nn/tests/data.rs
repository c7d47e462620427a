//! Data sets: seeded epoch orders, batches, drop_last, prefetch, splits, errors, and the
//! digits fixture.

use ndfuse::Array;
use ndfuse_nn::{Batch, Dataset, Error};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// `n` samples whose features are `[i, 10 i + 0.5]` (f32) and label `i` (i64), so a
/// batch can be checked against its indices without the code under test.
fn numbered(n: usize) -> Dataset {
    let x: Vec<f32> = (0..n)
        .flat_map(|i| [i as f32, i as f32 * 10.0 + 0.5])
        .collect();
    let y: Vec<i64> = (0..n as i64).collect();
    Dataset::new(
        Array::from_vec(x, &[n, 2]).unwrap(),
        Array::from_vec(y, &[n]).unwrap(),
    )
    .unwrap()
}

fn all(data: &Dataset, batch: usize, seed: u64, epoch: u64, drop_last: bool) -> Vec<Batch> {
    data.batches(batch, seed, epoch, drop_last)
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

fn order(batches: &[Batch]) -> Vec<usize> {
    batches.iter().flat_map(|b| b.indices.clone()).collect()
}

#[test]
fn the_same_seed_and_epoch_give_the_same_order() {
    let data = numbered(100);
    assert_eq!(all(&data, 7, 42, 3, false), all(&data, 7, 42, 3, false));
    // A clone (the same Arc) and a rebuilt data set agree too: the order is (seed, epoch) only.
    assert_eq!(
        order(&all(&numbered(100), 7, 42, 3, false)),
        order(&all(&data.clone(), 7, 42, 3, false))
    );
}

#[test]
fn other_epochs_and_seeds_give_other_orders() {
    let data = numbered(100);
    let e0 = order(&all(&data, 10, 42, 0, false));
    let e1 = order(&all(&data, 10, 42, 1, false));
    let s1 = order(&all(&data, 10, 43, 0, false));
    assert_ne!(e0, e1);
    assert_ne!(e0, s1);
    assert_ne!(e0, (0..100).collect::<Vec<_>>(), "not shuffled at all");
}

#[test]
fn the_order_is_the_pinned_splitmix_fisher_yates_stream() {
    // Computed by an independent Python transcription of the algorithm (SplitMix64,
    // the stream derivation, Lemire's bounded draw, Durstenfeld's shuffle), so a change
    // of the algorithm or a dependency that sneaks in shows up here.
    let data = numbered(10);
    assert_eq!(data.epoch_order(42, 0), PINNED_42_0);
    assert_eq!(data.epoch_order(42, 1), PINNED_42_1);
    assert_eq!(order(&all(&data, 3, 42, 0, false)), PINNED_42_0);
}

const PINNED_42_0: [usize; 10] = [0, 9, 8, 1, 4, 5, 2, 3, 6, 7];
const PINNED_42_1: [usize; 10] = [0, 7, 8, 1, 4, 9, 6, 2, 3, 5];

#[test]
fn every_sample_comes_exactly_once_per_epoch_with_its_own_label() {
    let data = numbered(103);
    for epoch in 0..4 {
        let batches = all(&data, 10, 5, epoch, false);
        assert_eq!(batches.len(), 11);
        assert!(batches[..10].iter().all(|b| b.indices.len() == 10));
        assert_eq!(batches[10].indices.len(), 3);
        let mut seen = order(&batches);
        seen.sort_unstable();
        assert_eq!(seen, (0..103).collect::<Vec<_>>());
        for b in &batches {
            let n = b.indices.len();
            assert_eq!(b.features.shape(), [n, 2]);
            assert_eq!(b.labels.shape(), [n]);
            let want_x: Vec<f32> = b
                .indices
                .iter()
                .flat_map(|&i| [i as f32, i as f32 * 10.0 + 0.5])
                .collect();
            let want_y: Vec<i64> = b.indices.iter().map(|&i| i as i64).collect();
            assert_eq!(b.features.to_vec::<f32>().unwrap(), want_x);
            assert_eq!(b.labels.to_vec::<i64>().unwrap(), want_y);
        }
    }
}

#[test]
fn drop_last_leaves_out_the_short_batch() {
    let data = numbered(103);
    let kept = all(&data, 10, 5, 0, true);
    assert_eq!(kept.len(), 10);
    assert!(kept.iter().all(|b| b.indices.len() == 10));
    // The same shuffle: drop_last cuts the tail, it does not reshuffle.
    assert_eq!(order(&kept), order(&all(&data, 10, 5, 0, false))[..100]);
    assert_eq!(data.batches(10, 5, 0, true).unwrap().len(), 10);
    assert_eq!(data.batches(10, 5, 0, false).unwrap().len(), 11);
    // Exact multiples lose nothing; fewer samples than a batch leave no batch.
    assert_eq!(all(&numbered(30), 10, 1, 0, true).len(), 3);
    assert_eq!(all(&numbered(7), 10, 1, 0, true).len(), 0);
    assert_eq!(all(&numbered(7), 10, 1, 0, false).len(), 1);
}

#[test]
fn batch_size_zero_is_an_error() {
    let err = numbered(5).batches(0, 1, 0, false).unwrap_err();
    assert!(matches!(err, Error::Argument { .. }), "{err}");
    assert!(err.to_string().contains("batch_size is 0"), "{err}");
}

#[test]
fn prefetch_yields_the_same_batches_in_the_same_order() {
    let data = numbered(257);
    for buffer in [0, 1, 4, 64] {
        let plain = all(&data, 16, 9, 2, false);
        let ahead: Vec<Batch> = data
            .batches(16, 9, 2, false)
            .unwrap()
            .prefetch(buffer)
            .map(Result::unwrap)
            .collect();
        assert_eq!(plain, ahead, "buffer {buffer}");
    }
}

#[test]
fn dropping_a_prefetcher_mid_epoch_returns_promptly() {
    // Big enough that assembling the whole epoch would take a noticeable time: 20,000
    // samples of 256 floats, batches of one sample, a buffer of two.
    let (n, width) = (20_000, 256);
    let x = Array::from_vec(vec![0.25f32; n * width], &[n, width]).unwrap();
    let y = Array::from_vec(vec![1i64; n], &[n]).unwrap();
    let data = Dataset::new(x, y).unwrap();
    let mut it = data.batches(1, 3, 0, false).unwrap().prefetch(2);
    for _ in 0..3 {
        assert_eq!(it.next().unwrap().unwrap().indices.len(), 1);
    }
    // Dropped on another thread, so that a drop that hangs fails the test instead of
    // hanging it.
    let t = Instant::now();
    let (done, dropped) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(it);
        let _ = done.send(());
    });
    let finished = dropped.recv_timeout(Duration::from_secs(5)).is_ok();
    let took = t.elapsed();
    assert!(
        finished,
        "dropping the prefetcher did not return within 5 s"
    );
    assert!(took < Duration::from_secs(2), "dropping took {took:?}");
}

#[test]
fn mismatched_sample_counts_name_both_shapes() {
    let x = Array::from_vec(vec![0.0f32; 12], &[4, 3]).unwrap();
    let y = Array::from_vec(vec![0i64; 5], &[5]).unwrap();
    let err = Dataset::new(x, y).unwrap_err().to_string();
    assert!(err.contains("[4, 3]") && err.contains("[5]"), "{err}");
}

#[test]
fn features_must_be_float_and_labels_not_bool() {
    let xi = Array::from_vec(vec![0i32; 4], &[4]).unwrap();
    let y = Array::from_vec(vec![0i64; 4], &[4]).unwrap();
    assert!(Dataset::new(xi, y.clone()).is_err());
    let x = Array::from_vec(vec![0.0f64; 4], &[4, 1]).unwrap();
    let yb = Array::from_vec(vec![true; 4], &[4]).unwrap();
    assert!(Dataset::new(x.clone(), yb).is_err());
    let yf = Array::from_vec(vec![0.5f32; 8], &[4, 2]).unwrap();
    let d = Dataset::new(x, yf).unwrap();
    assert_eq!(d.len(), 4);
    assert_eq!(d.feature_shape(), [1]);
}

#[test]
fn split_sizes_are_rounded_and_the_parts_are_disjoint() {
    let data = numbered(103);
    let (kept, held) = data.split(0.2, 11).unwrap();
    assert_eq!((kept.len(), held.len()), (82, 21)); // round(20.6) = 21
    let ids = |d: &Dataset| d.labels().to_vec::<i64>().unwrap();
    let (k, h) = (ids(&kept), ids(&held));
    let mut both: Vec<i64> = k.iter().chain(&h).copied().collect();
    both.sort_unstable();
    assert_eq!(both, (0..103).collect::<Vec<_>>(), "not a partition");
    // Each part keeps the original order, and features travel with their labels.
    assert!(k.windows(2).all(|w| w[0] < w[1]) && h.windows(2).all(|w| w[0] < w[1]));
    let hx = held.features().to_vec::<f32>().unwrap();
    assert_eq!(hx[0], h[0] as f32);
    assert_eq!(hx[1], h[0] as f32 * 10.0 + 0.5);
    // Deterministic, seed-dependent, and the held-out part is not just the tail.
    assert_eq!(ids(&data.split(0.2, 11).unwrap().1), h);
    assert_ne!(ids(&data.split(0.2, 12).unwrap().1), h);
    assert_ne!(h, (82..103).collect::<Vec<_>>());
    // The ends.
    assert_eq!(data.split(0.0, 1).unwrap().1.len(), 0);
    assert_eq!(data.split(1.0, 1).unwrap().0.len(), 0);
    assert!(data.split(1.5, 1).is_err());
    assert!(data.split(f64::NAN, 1).is_err());
}

#[test]
fn subset_gathers_rows_and_refuses_out_of_range() {
    let data = numbered(6);
    let s = data.subset(&[5, 0, 5]).unwrap();
    assert_eq!(s.labels().to_vec::<i64>().unwrap(), [5, 0, 5]);
    assert_eq!(
        s.features().to_vec::<f32>().unwrap(),
        [5.0, 50.5, 0.0, 0.5, 5.0, 50.5]
    );
    let err = data.subset(&[6]).unwrap_err().to_string();
    assert!(err.contains("index 6"), "{err}");
}

#[test]
fn from_npy_names_the_files_when_counts_disagree() {
    let dir = std::env::temp_dir().join(format!("ndfuse-nn-data-npy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (fx, fy) = (dir.join("x.npy"), dir.join("y.npy"));
    ndfuse::npy::write_npy(&fx, &Array::from_vec(vec![1.0f32; 6], &[3, 2]).unwrap()).unwrap();
    ndfuse::npy::write_npy(&fy, &Array::from_vec(vec![1i64; 2], &[2]).unwrap()).unwrap();
    let err = Dataset::from_npy(&fx, &fy).unwrap_err().to_string();
    assert!(err.contains("x.npy") && err.contains("y.npy"), "{err}");
    assert!(err.contains("[3, 2]") && err.contains("[2]"), "{err}");
    let missing = Dataset::from_npy(&dir.join("absent.npy"), &fy)
        .unwrap_err()
        .to_string();
    assert!(missing.contains("absent.npy"), "{missing}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_digits_fixture_loads() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/digits");
    let data = Dataset::from_npy(&dir.join("features.npy"), &dir.join("labels.npy")).unwrap();
    assert_eq!(data.len(), 1797);
    assert_eq!(data.feature_shape(), [64]);
    assert_eq!(data.features().dtype(), ndfuse::DType::F32);
    let labels = data.labels().to_vec::<i64>().unwrap();
    let mut counts = [0usize; 10];
    for &l in &labels {
        assert!((0..=9).contains(&l), "label {l}");
        counts[l as usize] += 1;
    }
    assert!(counts.iter().all(|c| (170..=190).contains(c)), "{counts:?}");
    let pixels = data.features().to_vec::<f32>().unwrap();
    assert!(pixels
        .iter()
        .all(|&p| p.fract() == 0.0 && (0.0..=16.0).contains(&p)));
    // The first image as scikit-learn's load_digits().data[0] prints it (a zero).
    assert_eq!(pixels[..8], [0.0, 0.0, 5.0, 13.0, 9.0, 1.0, 0.0, 0.0]);
    assert_eq!(labels[..5], [0, 1, 2, 3, 4]);
}
