//! A character-level text corpus: Debian's `fortunes` collections read and joined, a
//! vocabulary of the characters seen, the text as token ids split 90/10 into training
//! and validation, and seeded random windows of it as batches for a language model.
//!
//! The windows of a step are drawn on the host from `(seed, step)` alone (SplitMix64's
//! output function, [`crate::data`]'s `hash64`), so a resumed run, another backend or
//! the PyTorch script `scripts/train_gpt_torch.py` (which writes the same few lines)
//! sees the same batches.

use crate::data::hash64;
use crate::error::{Error, Result};
use ndfuse::Array;
use std::path::{Path, PathBuf};

/// Which part of a corpus.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// The first 90% (by default) of the ids.
    Train,
    /// The rest.
    Validation,
}

/// A text as character ids over a sorted vocabulary, split into training and
/// validation parts.
///
/// ```
/// use ndfuse_nn::{CharCorpus, Split};
/// let c = CharCorpus::from_text("abracadabra", 0.1)?;
/// assert_eq!(c.vocab(), &['a', 'b', 'c', 'd', 'r']);
/// assert_eq!(c.encode("cab")?, vec![2, 0, 1]);
/// assert_eq!(c.decode(&[4, 0]), "ra");
/// assert_eq!((c.ids(Split::Train).len(), c.ids(Split::Validation).len()), (10, 1));
/// # Ok::<(), ndfuse_nn::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct CharCorpus {
    vocab: Vec<char>,
    train: Vec<i64>,
    validation: Vec<i64>,
    files: Vec<PathBuf>,
}

impl CharCorpus {
    /// Where Debian's package `fortunes` installs its collections.
    pub const FORTUNES_DIR: &'static str = "/usr/share/games/fortunes";

    /// The share of the ids held out for validation by [`CharCorpus::fortunes`].
    pub const VALIDATION_FRACTION: f64 = 0.1;

    /// Whether `dir` holds the `fortunes` collections (its file `fortunes`).
    pub fn present(dir: &Path) -> bool {
        dir.join("fortunes").is_file()
    }

    /// The collections under `dir` (see [`CharCorpus::read_fortunes`]) with the last
    /// 10% of the ids held out.
    pub fn fortunes(dir: &Path) -> Result<CharCorpus> {
        CharCorpus::read_fortunes(dir, CharCorpus::VALIDATION_FRACTION)
    }

    /// Every plain text file directly under `dir` (not `*.dat` indexes, not the `*.u8`
    /// links, no symbolic link, no folder: so never `off/`, where `fortunes-off` keeps
    /// its offensive collections), joined in sorted file-name order, decoded as UTF-8
    /// (an invalid byte becomes U+FFFD), the last `validation_fraction` of the ids held
    /// out. `Err` naming the folder, with the package to install, when it is missing or
    /// holds no collection; `Err` naming the file when one cannot be read.
    pub fn read_fortunes(dir: &Path, validation_fraction: f64) -> Result<CharCorpus> {
        let missing = |why: String| Error::Data {
            path: dir.to_path_buf(),
            why,
        };
        let entries = std::fs::read_dir(dir).map_err(|e| {
            missing(format!(
                "{e}: the fortunes corpus comes from Debian's package `fortunes` (apt-get install fortunes)"
            ))
        })?;
        let mut files = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|source| Error::Io {
                path: dir.to_path_buf(),
                source,
            })?;
            let path = entry.path();
            // symlink_metadata: a link is skipped, not followed.
            let plain = std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_file());
            let skipped = path.extension().is_some_and(|e| e == "dat" || e == "u8");
            if plain && !skipped {
                files.push(path);
            }
        }
        files.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
        if files.is_empty() {
            return Err(missing(
                "no fortune collection here: install Debian's package `fortunes` (apt-get install fortunes)".into(),
            ));
        }
        let mut text = String::new();
        for f in &files {
            let bytes = std::fs::read(f).map_err(|source| Error::Io {
                path: f.clone(),
                source,
            })?;
            text.push_str(&String::from_utf8_lossy(&bytes));
        }
        let mut corpus = CharCorpus::from_text(&text, validation_fraction)?;
        corpus.files = files;
        Ok(corpus)
    }

    /// `text` as ids over its sorted unique characters, the last `validation_fraction`
    /// (in `[0, 1)`, rounded down to whole ids) held out. `Err` for an empty text or a
    /// fraction outside `[0, 1)`.
    pub fn from_text(text: &str, validation_fraction: f64) -> Result<CharCorpus> {
        if !(0.0..1.0).contains(&validation_fraction) {
            return Err(Error::Argument {
                what: "CharCorpus::from_text",
                why: format!("validation fraction {validation_fraction} is outside [0, 1)"),
            });
        }
        let mut vocab: Vec<char> = text.chars().collect();
        vocab.sort_unstable();
        vocab.dedup();
        if vocab.is_empty() {
            return Err(Error::Argument {
                what: "CharCorpus::from_text",
                why: "the text is empty".into(),
            });
        }
        let mut ids = Vec::with_capacity(text.len());
        for c in text.chars() {
            // Present: the vocabulary is made of these very characters.
            ids.push(vocab.binary_search(&c).unwrap_or(0) as i64);
        }
        let held = (ids.len() as f64 * validation_fraction) as usize;
        let validation = ids.split_off(ids.len() - held);
        Ok(CharCorpus {
            vocab,
            train: ids,
            validation,
            files: Vec::new(),
        })
    }

    /// The characters, sorted; a character's id is its index here.
    pub fn vocab(&self) -> &[char] {
        &self.vocab
    }

    /// The number of distinct characters.
    pub fn vocab_size(&self) -> usize {
        self.vocab.len()
    }

    /// The files read, in order (none for [`CharCorpus::from_text`]).
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    /// The ids of a split.
    pub fn ids(&self, split: Split) -> &[i64] {
        match split {
            Split::Train => &self.train,
            Split::Validation => &self.validation,
        }
    }

    /// `s` as ids; `Err` naming the first character not in the vocabulary.
    pub fn encode(&self, s: &str) -> Result<Vec<i64>> {
        s.chars()
            .map(|c| {
                self.vocab
                    .binary_search(&c)
                    .map(|i| i as i64)
                    .map_err(|_| Error::Argument {
                        what: "CharCorpus::encode",
                        why: format!("character {c:?} is not in the corpus's vocabulary"),
                    })
            })
            .collect()
    }

    /// The text of `ids` (an id outside the vocabulary becomes U+FFFD).
    pub fn decode(&self, ids: &[i64]) -> String {
        ids.iter()
            .map(|&i| {
                usize::try_from(i)
                    .ok()
                    .and_then(|i| self.vocab.get(i).copied())
                    .unwrap_or(char::REPLACEMENT_CHARACTER)
            })
            .collect()
    }

    /// The start of row `row` of step `step`'s windows of `len` ids over `n` ids:
    /// uniform over the `n - len + 1` starts, by Lemire's multiply-shift of a hash of
    /// `(seed, step, row)` (bias below 2^-40 for any corpus that fits in memory).
    fn start(seed: u64, step: u64, row: u64, n: usize, len: usize) -> usize {
        let base = hash64(seed ^ hash64(step));
        let r = hash64(base ^ hash64(row));
        let count = (n - len + 1) as u128;
        ((u128::from(r) * count) >> 64) as usize
    }

    /// `batch` random windows of `context + 1` consecutive ids of `split`, drawn from
    /// `(seed, step)` only: an i64 array `[batch, context + 1]`. `Err` when the split
    /// is shorter than a window.
    pub fn windows(
        &self,
        split: Split,
        batch: usize,
        context: usize,
        seed: u64,
        step: u64,
    ) -> Result<Array> {
        let ids = self.ids(split);
        let len = context + 1;
        if ids.len() < len {
            return Err(Error::Argument {
                what: "CharCorpus::windows",
                why: format!(
                    "the {split:?} split has {} ids; a window needs {len}",
                    ids.len()
                ),
            });
        }
        let mut out = Vec::with_capacity(batch * len);
        for row in 0..batch as u64 {
            let s = CharCorpus::start(seed, step, row, ids.len(), len);
            out.extend_from_slice(&ids[s..s + len]);
        }
        Ok(Array::from_vec(out, &[batch, len])?)
    }

    /// [`CharCorpus::windows`] as a language model's batch: the inputs (each window but
    /// its last id) and the targets (each window but its first), both i64
    /// `[batch, context]`.
    pub fn batch(
        &self,
        split: Split,
        batch: usize,
        context: usize,
        seed: u64,
        step: u64,
    ) -> Result<(Array, Array)> {
        let w = self.windows(split, batch, context, seed, step)?;
        let w = w.as_slice::<i64>()?;
        let len = context + 1;
        let (mut x, mut y) = (
            Vec::with_capacity(batch * context),
            Vec::with_capacity(batch * context),
        );
        for row in w.chunks_exact(len) {
            x.extend_from_slice(&row[..context]);
            y.extend_from_slice(&row[1..]);
        }
        Ok((
            Array::from_vec(x, &[batch, context])?,
            Array::from_vec(y, &[batch, context])?,
        ))
    }
}
