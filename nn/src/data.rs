//! Data sets of feature and label arrays (.npy), seeded shuffled mini-batches and a prefetch thread.
//!
//! A [`Dataset`] is a pair of host arrays whose first axis counts samples. Its order of
//! samples for an epoch is a Fisher-Yates shuffle driven by a hand-written SplitMix64
//! stream of `(seed, epoch)` alone, so a run is reproducible across machines, thread
//! counts and dependency upgrades. [`Batches`] gathers each mini-batch into contiguous
//! arrays; [`Batches::prefetch`] moves that work onto a thread that stays a bounded number
//! of batches ahead.
//!
//! ```
//! use ndfuse::Array;
//! use ndfuse_nn::Dataset;
//! let x = Array::from_vec((0..12).map(|v| v as f32).collect(), &[6, 2])?;
//! let y = Array::from_vec(vec![0i64, 1, 0, 1, 0, 1], &[6])?;
//! let data = Dataset::new(x, y)?;
//! let mut seen = 0;
//! for batch in data.batches(4, 7, 0, false)?.prefetch(2) {
//!     let batch = batch?;
//!     assert_eq!(batch.features.shape()[1], 2);
//!     seen += batch.indices.len();
//! }
//! assert_eq!(seen, 6);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::error::{Error, Result};
use ndfuse::{Array, DType};
use ndfuse_ir::{HostArray, Shape, Storage};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Features and labels, one sample per index of their first axis.
///
/// Cloning is cheap (the arrays sit behind an `Arc`), which is how a prefetch thread
/// gets its own handle.
#[derive(Clone, Debug)]
pub struct Dataset {
    inner: Arc<Samples>,
}

#[derive(Debug)]
struct Samples {
    features: Array,
    labels: Array,
}

impl Dataset {
    /// A data set of `features` (any float dtype, first axis = samples) and `labels`
    /// (i32/i64 class indices or float targets, first axis = samples).
    ///
    /// `Err` when either is 0-d, the dtypes are not those, or the sample counts differ
    /// (the message names both shapes).
    pub fn new(features: Array, labels: Array) -> Result<Dataset> {
        check(&features, &labels)?;
        Ok(Dataset {
            inner: Arc::new(Samples { features, labels }),
        })
    }

    /// A data set read from two `.npy` files (see [`ndfuse::npy::read_npy`]).
    ///
    /// `Err` naming the file when one cannot be read; `Err` naming both files and both
    /// shapes when they disagree.
    pub fn from_npy(features_path: &Path, labels_path: &Path) -> Result<Dataset> {
        let features = ndfuse::npy::read_npy(features_path)?;
        let labels = ndfuse::npy::read_npy(labels_path)?;
        check(&features, &labels).map_err(|e| match e {
            Error::Argument { why, .. } => Error::Argument {
                what: "Dataset::from_npy",
                why: format!(
                    "{} and {}: {why}",
                    features_path.display(),
                    labels_path.display()
                ),
            },
            other => other,
        })?;
        Ok(Dataset {
            inner: Arc::new(Samples { features, labels }),
        })
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.inner.features.shape()[0]
    }

    /// Whether there are no samples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// All features, samples along the first axis.
    pub fn features(&self) -> &Array {
        &self.inner.features
    }

    /// All labels, samples along the first axis.
    pub fn labels(&self) -> &Array {
        &self.inner.labels
    }

    /// The shape of one sample's features (the features' shape without its first axis).
    pub fn feature_shape(&self) -> &[usize] {
        &self.inner.features.shape()[1..]
    }

    /// The samples at `indices`, in that order (repeats allowed); `Err` for an index out
    /// of range.
    pub fn subset(&self, indices: &[usize]) -> Result<Dataset> {
        if let Some(&bad) = indices.iter().find(|&&i| i >= self.len()) {
            return Err(Error::Argument {
                what: "Dataset::subset",
                why: format!("index {bad} out of range for {} samples", self.len()),
            });
        }
        Ok(Dataset {
            inner: Arc::new(Samples {
                features: gather(&self.inner.features, indices)?,
                labels: gather(&self.inner.labels, indices)?,
            }),
        })
    }

    /// Splits the samples in two by a seeded permutation: `(kept, held_out)`, where
    /// `held_out` has `round(len * held_out_fraction)` samples. Each part keeps the
    /// original order of its samples; the same seed always gives the same parts.
    ///
    /// `Err` unless `0 <= held_out_fraction <= 1`.
    pub fn split(&self, held_out_fraction: f64, seed: u64) -> Result<(Dataset, Dataset)> {
        if !(0.0..=1.0).contains(&held_out_fraction) {
            return Err(Error::Argument {
                what: "Dataset::split",
                why: format!("held_out_fraction {held_out_fraction} is not in [0, 1]"),
            });
        }
        let n = self.len();
        let held = ((n as f64) * held_out_fraction).round() as usize;
        let order = permutation(n, SplitMix64::stream(seed, SPLIT_STREAM, 0));
        let (mut kept, mut out) = (order[..n - held].to_vec(), order[n - held..].to_vec());
        kept.sort_unstable();
        out.sort_unstable();
        Ok((self.subset(&kept)?, self.subset(&out)?))
    }

    /// The mini-batches of one epoch: every sample exactly once, in an order that
    /// depends on `(seed, epoch)` only. With `drop_last` a final batch smaller than
    /// `batch_size` is left out.
    ///
    /// `Err` when `batch_size` is 0.
    pub fn batches(
        &self,
        batch_size: usize,
        seed: u64,
        epoch: u64,
        drop_last: bool,
    ) -> Result<Batches> {
        if batch_size == 0 {
            return Err(Error::Argument {
                what: "Dataset::batches",
                why: "batch_size is 0".to_string(),
            });
        }
        let n = self.len();
        let mut order = permutation(n, SplitMix64::stream(seed, EPOCH_STREAM, epoch));
        if drop_last {
            order.truncate(n - n % batch_size);
        }
        Ok(Batches {
            data: self.clone(),
            order,
            batch_size,
            next: 0,
        })
    }

    /// The order in which [`Dataset::batches`] visits the samples for `(seed, epoch)`.
    pub fn epoch_order(&self, seed: u64, epoch: u64) -> Vec<usize> {
        permutation(self.len(), SplitMix64::stream(seed, EPOCH_STREAM, epoch))
    }
}

/// The checks of [`Dataset::new`]; `Err(Error::Argument)`.
fn check(features: &Array, labels: &Array) -> Result<()> {
    let refuse = |why: String| {
        Err(Error::Argument {
            what: "Dataset::new",
            why,
        })
    };
    let (fs, ls) = (features.shape(), labels.shape());
    if fs.is_empty() || ls.is_empty() {
        return refuse(format!(
            "features {fs:?} and labels {ls:?} need a first axis of samples (one is 0-d)"
        ));
    }
    if fs[0] != ls[0] {
        return refuse(format!(
            "features {fs:?} hold {} samples but labels {ls:?} hold {}",
            fs[0], ls[0]
        ));
    }
    if !matches!(
        features.dtype(),
        DType::F16 | DType::BF16 | DType::F32 | DType::F64
    ) {
        return refuse(format!(
            "features are {}, a float dtype is needed",
            features.dtype()
        ));
    }
    if labels.dtype() == DType::Bool {
        return refuse(
            "labels are bool: class indices (i32/i64) or float targets are needed".into(),
        );
    }
    Ok(())
}

/// The rows `indices` of `a` (along its first axis) in one contiguous array.
fn gather(a: &Array, indices: &[usize]) -> Result<Array> {
    fn rows<T: Copy>(v: &[T], row: usize, indices: &[usize]) -> Vec<T> {
        let mut out = Vec::with_capacity(row * indices.len());
        for &i in indices {
            out.extend_from_slice(&v[i * row..(i + 1) * row]);
        }
        out
    }
    let mut dims = a.shape().to_vec();
    let row: usize = dims[1..].iter().product();
    dims[0] = indices.len();
    let storage = match a.as_host().storage() {
        Storage::F16(v) => Storage::F16(rows(v, row, indices)),
        Storage::BF16(v) => Storage::BF16(rows(v, row, indices)),
        Storage::F32(v) => Storage::F32(rows(v, row, indices)),
        Storage::F64(v) => Storage::F64(rows(v, row, indices)),
        Storage::I32(v) => Storage::I32(rows(v, row, indices)),
        Storage::I64(v) => Storage::I64(rows(v, row, indices)),
        Storage::Bool(v) => Storage::Bool(rows(v, row, indices)),
    };
    HostArray::new(Shape::from(&dims[..]), storage)
        .map(Array::from_host)
        .ok_or_else(|| Error::Argument {
            what: "Dataset gather",
            why: format!("bug: gathered rows do not fill shape {dims:?}"),
        })
}

/// One mini-batch: the gathered features and labels and the sample indices they came from.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    /// Features of the batch's samples, `[batch, feature_shape...]`.
    pub features: Array,
    /// Labels of the batch's samples, `[batch, label_shape...]`.
    pub labels: Array,
    /// Which samples of the data set, in batch order.
    pub indices: Vec<usize>,
}

/// The mini-batches of one epoch, assembled on the calling thread (see
/// [`Dataset::batches`]; [`Batches::prefetch`] assembles them on another).
#[derive(Clone, Debug)]
pub struct Batches {
    data: Dataset,
    order: Vec<usize>,
    batch_size: usize,
    next: usize,
}

impl Batches {
    /// Assembles the batches on a thread of their own, up to `buffer` of them ahead
    /// (a bounded channel; 0 hands each batch over as it is made). The batches come in
    /// the same order as without prefetch. Dropping the [`Prefetch`] early stops the
    /// thread and waits for it.
    pub fn prefetch(self, buffer: usize) -> Prefetch {
        Prefetch::spawn(self, buffer)
    }
}

impl Iterator for Batches {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Result<Batch>> {
        if self.next >= self.order.len() {
            return None;
        }
        let end = (self.next + self.batch_size).min(self.order.len());
        let indices = self.order[self.next..end].to_vec();
        self.next = end;
        let batch = gather(&self.data.inner.features, &indices).and_then(|features| {
            Ok(Batch {
                features,
                labels: gather(&self.data.inner.labels, &indices)?,
                indices,
            })
        });
        Some(batch)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = (self.order.len() - self.next).div_ceil(self.batch_size);
        (left, Some(left))
    }
}

impl ExactSizeIterator for Batches {}

/// Batches assembled ahead on a producer thread (see [`Batches::prefetch`]).
///
/// A panic on the producer thread becomes one `Err` item, after which the iterator ends.
pub struct Prefetch {
    rx: Option<Receiver<Result<Batch>>>,
    worker: Option<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
}

impl std::fmt::Debug for Prefetch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prefetch")
            .field("running", &self.worker.is_some())
            .finish_non_exhaustive()
    }
}

impl Prefetch {
    /// Runs `source` on a new thread feeding a channel of `buffer` slots.
    fn spawn<I>(source: I, buffer: usize) -> Prefetch
    where
        I: Iterator<Item = Result<Batch>> + Send + 'static,
    {
        let (tx, rx) = sync_channel(buffer);
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let worker = std::thread::Builder::new()
            .name("ndfuse-nn prefetch".into())
            .spawn(move || {
                for item in source {
                    // A send fails once the receiver is gone: the consumer dropped us.
                    if stopped.load(Ordering::Relaxed) || tx.send(item).is_err() {
                        break;
                    }
                }
            });
        match worker {
            Ok(worker) => Prefetch {
                rx: Some(rx),
                worker: Some(worker),
                stop,
            },
            Err(e) => {
                // No thread could be had: the one item says so, then the iterator ends.
                let (tx, rx) = sync_channel(1);
                let _ = tx.send(Err(Error::Prefetch {
                    why: format!("could not start the prefetch thread: {e}"),
                }));
                Prefetch {
                    rx: Some(rx),
                    worker: None,
                    stop,
                }
            }
        }
    }

    /// Stops and joins the producer; `Err` with its panic message when it panicked.
    fn finish(&mut self) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        // Dropping the receiver wakes a producer blocked on a full channel.
        self.rx = None;
        match self.worker.take().map(JoinHandle::join) {
            Some(Err(payload)) => {
                let why = payload
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic with a non-string payload".to_string());
                Err(Error::Prefetch {
                    why: format!("the producer thread panicked: {why}"),
                })
            }
            _ => Ok(()),
        }
    }
}

impl Iterator for Prefetch {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Result<Batch>> {
        let item = self.rx.as_ref()?.recv().ok();
        match item {
            Some(item) => Some(item),
            // The producer hung up: it finished, or it panicked.
            None => self.finish().err().map(Err),
        }
    }
}

impl Drop for Prefetch {
    fn drop(&mut self) {
        // A panic that nobody asked about any more is not worth a second panic.
        let _ = self.finish();
    }
}

/// Stream domains, so that the split and the epochs never share random numbers.
const SPLIT_STREAM: u64 = 0x7370_6c69_7400_0000; // "split"
const EPOCH_STREAM: u64 = 0x6570_6f63_6800_0000; // "epoch"

/// SplitMix64 (Steele, Lea & Flood 2014; the constants of Vigna's reference C code),
/// written out here so that shuffles never change with a dependency's version.
#[derive(Clone, Debug)]
struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

    fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    /// The generator for `(seed, domain, index)`: each input passes through the
    /// finaliser, so nearby seeds or epochs give unrelated streams.
    fn stream(seed: u64, domain: u64, index: u64) -> SplitMix64 {
        let mut g = SplitMix64::new(seed);
        let a = g.next_u64();
        let b = SplitMix64::new(domain ^ a).next_u64();
        SplitMix64::new(b ^ mix(index.wrapping_add(Self::GAMMA)))
    }

    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(Self::GAMMA);
        mix(self.state)
    }

    /// Uniform in `0..n` (`n > 0`), unbiased: Lemire's multiply-shift with rejection.
    fn below(&mut self, n: u64) -> u64 {
        let threshold = n.wrapping_neg() % n;
        loop {
            let m = u128::from(self.next_u64()) * u128::from(n);
            if (m as u64) >= threshold {
                return (m >> 64) as u64;
            }
        }
    }
}

/// The SplitMix64 output of state `x`: its golden-ratio step, then [`mix`]. A
/// well-mixed 64-bit value of `x`, also what step seeds and dropout offsets derive from.
pub(crate) fn hash64(x: u64) -> u64 {
    mix(x.wrapping_add(SplitMix64::GAMMA))
}

/// SplitMix64's output function.
fn mix(z: u64) -> u64 {
    let z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `0..n` shuffled by Fisher-Yates (Durstenfeld's form: from the end down).
fn permutation(n: usize, mut rng: SplitMix64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        order.swap(i, j);
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_matches_the_reference_outputs() {
        // Vigna's splitmix64.c seeded with 1234567 (values published with the code and
        // reproduced by every port of it).
        let mut g = SplitMix64::new(1_234_567);
        let got: Vec<u64> = (0..5).map(|_| g.next_u64()).collect();
        assert_eq!(
            got,
            [
                6_457_827_717_110_365_317,
                3_203_168_211_198_807_973,
                9_817_491_932_198_370_423,
                4_593_380_528_125_082_431,
                16_408_922_859_458_223_821,
            ]
        );
    }

    #[test]
    fn below_stays_in_range_and_reaches_every_value() {
        let mut g = SplitMix64::new(9);
        let mut seen = [0usize; 7];
        for _ in 0..7_000 {
            seen[g.below(7) as usize] += 1;
        }
        assert!(seen.iter().all(|&c| (800..1200).contains(&c)), "{seen:?}");
    }

    fn tiny() -> Dataset {
        let x = Array::from_vec((0..10).map(|v| v as f32).collect(), &[10, 1]).unwrap();
        let y = Array::from_vec((0..10i64).collect(), &[10]).unwrap();
        Dataset::new(x, y).unwrap()
    }

    #[test]
    fn a_panicking_producer_becomes_an_error_item() {
        let data = tiny();
        let mut first = data.batches(3, 1, 0, false).unwrap();
        let ok = first.next().unwrap().unwrap();
        let mut calls = 0;
        let source = std::iter::from_fn(move || {
            calls += 1;
            if calls == 1 {
                Some(Ok(ok.clone()))
            } else {
                panic!("boom in the producer")
            }
        });
        let items: Vec<Result<Batch>> = Prefetch::spawn(source, 1).collect();
        assert_eq!(items.len(), 2);
        assert!(items[0].is_ok());
        let err = items[1].as_ref().unwrap_err().to_string();
        assert!(err.contains("boom in the producer"), "{err}");
    }
}
