//! IDX files (the MNIST format: LeCun's, and Fashion-MNIST's), plain or gzip'd, and the
//! Fashion-MNIST data set read from them.
//!
//! An IDX file is a 4-byte magic number (two zero bytes, a type code, the rank), the
//! extents as big-endian u32, then the elements in row-major order, big-endian. Type
//! codes: 0x08 u8, 0x09 i8, 0x0B i16, 0x0C i32, 0x0D f32, 0x0E f64. A file whose
//! first two bytes are gzip's (0x1f 0x8b) is decompressed as it is read (`flate2`).
//! Every malformed file is an [`Error::Data`] naming the file and what is wrong: a bad
//! magic number, a header or data shorter than the extents need, bytes left over, or a
//! gzip stream that does not decode.
//!
//! [`FashionMnist::load`] reads the four files of Zalando's Fashion-MNIST (60,000
//! training and 10,000 test images of 28 x 28 grey pixels, ten classes of clothing; MIT
//! licence) as Debian's package `dataset-fashion-mnist` installs them, in
//! [`FashionMnist::DIR`].

use crate::data::Dataset;
use crate::error::{Error, Result};
use ndfuse::Array;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The elements of an IDX file, in their own type.
#[derive(Clone, Debug, PartialEq)]
pub enum IdxValues {
    /// Type code 0x08.
    U8(Vec<u8>),
    /// Type code 0x09.
    I8(Vec<i8>),
    /// Type code 0x0B.
    I16(Vec<i16>),
    /// Type code 0x0C.
    I32(Vec<i32>),
    /// Type code 0x0D.
    F32(Vec<f32>),
    /// Type code 0x0E.
    F64(Vec<f64>),
}

impl IdxValues {
    /// The number of elements.
    pub fn len(&self) -> usize {
        match self {
            IdxValues::U8(v) => v.len(),
            IdxValues::I8(v) => v.len(),
            IdxValues::I16(v) => v.len(),
            IdxValues::I32(v) => v.len(),
            IdxValues::F32(v) => v.len(),
            IdxValues::F64(v) => v.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The contents of an IDX file: its extents and its elements, row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct Idx {
    /// The extents, outermost first.
    pub dims: Vec<usize>,
    /// The elements.
    pub values: IdxValues,
}

impl Idx {
    /// The elements as an array of the nearest dtype: integers as i32, f32 as f32, f64
    /// as f64.
    pub fn to_array(&self) -> Result<Array> {
        let dims = &self.dims;
        Ok(match &self.values {
            IdxValues::U8(v) => Array::from_vec(v.iter().map(|&x| i32::from(x)).collect(), dims)?,
            IdxValues::I8(v) => Array::from_vec(v.iter().map(|&x| i32::from(x)).collect(), dims)?,
            IdxValues::I16(v) => Array::from_vec(v.iter().map(|&x| i32::from(x)).collect(), dims)?,
            IdxValues::I32(v) => Array::from_vec(v.clone(), dims)?,
            IdxValues::F32(v) => Array::from_vec(v.clone(), dims)?,
            IdxValues::F64(v) => Array::from_vec(v.clone(), dims)?,
        })
    }
}

/// Reads the IDX file at `path`, gzip'd or not.
pub fn read_idx(path: &Path) -> Result<Idx> {
    let bad = |why: String| Error::Data {
        path: path.to_path_buf(),
        why,
    };
    let raw = std::fs::read(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let bytes = if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&raw[..])
            .read_to_end(&mut out)
            .map_err(|e| bad(format!("gzip: {e}")))?;
        out
    } else {
        raw
    };
    parse_idx(&bytes).map_err(bad)
}

/// The IDX file whose bytes are `bytes` (decompressed), or what is wrong with it.
pub fn parse_idx(bytes: &[u8]) -> std::result::Result<Idx, String> {
    let [0, 0, code, rank, ..] = *bytes else {
        return Err(match bytes.get(..4) {
            Some(m) => format!(
                "not an IDX file: magic number {m:02x?}, expected two zero bytes, a type code and a rank"
            ),
            None => format!(
                "not an IDX file: {} bytes, shorter than the 4 of the magic number",
                bytes.len()
            ),
        });
    };
    let width = match code {
        0x08 | 0x09 => 1,
        0x0B => 2,
        0x0C | 0x0D => 4,
        0x0E => 8,
        _ => {
            return Err(format!(
                "type code 0x{code:02x} is not an IDX type (0x08 u8, 0x09 i8, 0x0b i16, 0x0c i32, 0x0d f32, 0x0e f64)"
            ))
        }
    };
    let rank = usize::from(rank);
    let header = 4 + 4 * rank;
    if bytes.len() < header {
        return Err(format!(
            "the header of rank {rank} needs {header} bytes, the file has {}",
            bytes.len()
        ));
    }
    let dims: Vec<usize> = bytes[4..header]
        .chunks_exact(4)
        .map(|d| u32::from_be_bytes([d[0], d[1], d[2], d[3]]) as usize)
        .collect();
    let count = dims
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .filter(|n| n.checked_mul(width).is_some())
        .ok_or_else(|| format!("extents {dims:?} overflow"))?;
    let data = &bytes[header..];
    if data.len() != count * width {
        return Err(format!(
            "extents {dims:?} need {} bytes of data, the file has {}",
            count * width,
            data.len()
        ));
    }
    let values = match code {
        0x08 => IdxValues::U8(data.to_vec()),
        0x09 => IdxValues::I8(data.iter().map(|&b| b as i8).collect()),
        0x0B => IdxValues::I16(
            data.chunks_exact(2)
                .map(|c| i16::from_be_bytes([c[0], c[1]]))
                .collect(),
        ),
        0x0C => IdxValues::I32(
            data.chunks_exact(4)
                .map(|c| i32::from_be_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        0x0D => IdxValues::F32(
            data.chunks_exact(4)
                .map(|c| f32::from_be_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        _ => IdxValues::F64(
            data.chunks_exact(8)
                .map(|c| f64::from_be_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect(),
        ),
    };
    Ok(Idx { dims, values })
}

/// Fashion-MNIST: images as f32 `[N, 1, 28, 28]` (NCHW, one channel), pixels over 255
/// (in [0, 1]), labels i64 `[N]` in 0..10 ([`FashionMnist::CLASSES`]).
#[derive(Debug)]
pub struct FashionMnist {
    /// The 60,000 training images.
    pub train: Dataset,
    /// The 10,000 test images.
    pub test: Dataset,
}

impl FashionMnist {
    /// Where Debian's package `dataset-fashion-mnist` puts the files.
    pub const DIR: &'static str = "/usr/share/datasets/fashion-mnist";

    /// The ten classes, by label.
    pub const CLASSES: [&'static str; 10] = [
        "T-shirt/top",
        "Trouser",
        "Pullover",
        "Dress",
        "Coat",
        "Sandal",
        "Shirt",
        "Sneaker",
        "Bag",
        "Ankle boot",
    ];

    /// The four files' names: training images and labels, test images and labels.
    pub const FILES: [&'static str; 4] = [
        "train-images-idx3-ubyte.gz",
        "train-labels-idx1-ubyte.gz",
        "t10k-images-idx3-ubyte.gz",
        "t10k-labels-idx1-ubyte.gz",
    ];

    /// Reads the data set from `dir` (usually [`Self::DIR`]); a missing file is an
    /// [`Error::Data`] that says which package provides it.
    pub fn load(dir: &Path) -> Result<FashionMnist> {
        let [train_x, train_y, test_x, test_y] = Self::FILES.map(|f| dir.join(f));
        Ok(FashionMnist {
            train: split(&train_x, &train_y)?,
            test: split(&test_x, &test_y)?,
        })
    }

    /// Whether the four files are in `dir`.
    pub fn present(dir: &Path) -> bool {
        Self::FILES.iter().all(|f| dir.join(f).is_file())
    }
}

/// One split of Fashion-MNIST: the images of `images`, the labels of `labels`.
fn split(images: &Path, labels: &Path) -> Result<Dataset> {
    let x = read_present(images)?;
    let y = read_present(labels)?;
    let bad = |path: &Path, why: String| Error::Data {
        path: path.to_path_buf(),
        why,
    };
    let (IdxValues::U8(pixels), &[n, 28, 28]) = (&x.values, &x.dims[..]) else {
        return Err(bad(
            images,
            format!(
                "expected u8 images of [N, 28, 28], found {} of {:?}",
                type_name(&x.values),
                x.dims
            ),
        ));
    };
    let (IdxValues::U8(classes), &[m]) = (&y.values, &y.dims[..]) else {
        return Err(bad(
            labels,
            format!(
                "expected u8 labels of [N], found {} of {:?}",
                type_name(&y.values),
                y.dims
            ),
        ));
    };
    if m != n {
        return Err(bad(
            labels,
            format!("{m} labels for the {n} images of {}", images.display()),
        ));
    }
    if let Some(i) = classes.iter().position(|&c| c >= 10) {
        return Err(bad(
            labels,
            format!(
                "label {} at position {i} is not a class (0..10)",
                classes[i]
            ),
        ));
    }
    let features = Array::from_vec(
        pixels.iter().map(|&p| f32::from(p) / 255.0).collect(),
        &[n, 1, 28, 28],
    )?;
    let labels = Array::from_vec(classes.iter().map(|&c| i64::from(c)).collect(), &[n])?;
    Dataset::new(features, labels)
}

/// [`read_idx`], with a missing file's error saying where Fashion-MNIST comes from.
fn read_present(path: &Path) -> Result<Idx> {
    if !path.exists() {
        return Err(Error::Data {
            path: PathBuf::from(path),
            why: format!(
                "not found: Fashion-MNIST comes from Debian's package dataset-fashion-mnist \
                 (`apt install dataset-fashion-mnist` puts it in {})",
                FashionMnist::DIR
            ),
        });
    }
    read_idx(path)
}

/// `u8`, `i8`, ...: the element type's name, for errors.
fn type_name(v: &IdxValues) -> &'static str {
    match v {
        IdxValues::U8(_) => "u8",
        IdxValues::I8(_) => "i8",
        IdxValues::I16(_) => "i16",
        IdxValues::I32(_) => "i32",
        IdxValues::F32(_) => "f32",
        IdxValues::F64(_) => "f64",
    }
}
