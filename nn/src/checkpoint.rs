//! Parameters and optimiser state saved to and loaded from safetensors files, atomically.
//!
//! The format is Hugging Face's `safetensors` (an 8-byte header length, a JSON header of
//! names, dtypes, shapes and byte ranges plus string metadata, then the raw
//! little-endian tensors), read and written with its own crate so that PyTorch, JAX or
//! numpy tools open our files. Every ndfuse dtype has a safetensors dtype of the same
//! bits: f16 `F16`, bf16 `BF16`, f32 `F32`, f64 `F64`, i32 `I32`, i64 `I64`, bool `BOOL`.
//! Values are copied bit for bit (NaN payloads included).
//!
//! [`save`] writes a temporary file in the target's directory, syncs it and renames it
//! over the target: a crash leaves the previous checkpoint or the new one, never a mix.
//! [`load`] refuses a truncated or corrupt file with an error naming the file (and the
//! tensor when one tensor's bytes are at fault); it never panics on a file's contents.
//!
//! ```
//! use ndfuse::{Array, DType};
//! use ndfuse_nn::{load_checkpoint, save_checkpoint};
//! use std::collections::BTreeMap;
//! let path = std::env::temp_dir().join(format!("ndfuse-nn-ckpt-doc-{}.safetensors", std::process::id()));
//! let w = Array::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
//! let meta = BTreeMap::from([("step".to_string(), "100".to_string())]);
//! save_checkpoint(&path, &[("layer0.weight", &w)], &meta)?;
//! let ckpt = load_checkpoint(&path)?;
//! assert_eq!(ckpt.expect_shape("layer0.weight", &[2, 2], DType::F32)?, &w);
//! assert_eq!(ckpt.metadata()["step"], "100");
//! # std::fs::remove_file(&path).ok();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::error::{Error, Result};
use half::{bf16, f16};
use ndfuse::{Array, DType};
use ndfuse_ir::{HostArray, Shape, Storage};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// The tensors and metadata of a checkpoint file, read by [`load`].
#[derive(Clone, Debug)]
pub struct Checkpoint {
    /// The tensors by name.
    pub tensors: BTreeMap<String, Array>,
    /// The file's string metadata (`__metadata__` in the header).
    pub metadata: BTreeMap<String, String>,
    path: PathBuf,
}

impl Checkpoint {
    /// The file this checkpoint was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The string metadata saved with the tensors.
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// The tensor `name`; `Err` naming the file and the tensor when there is none.
    pub fn get(&self, name: &str) -> Result<&Array> {
        self.tensors.get(name).ok_or_else(|| self.missing(name))
    }

    /// Moves the tensor `name` out of the checkpoint; `Err` as for [`Checkpoint::get`].
    pub fn take(&mut self, name: &str) -> Result<Array> {
        match self.tensors.remove(name) {
            Some(a) => Ok(a),
            None => Err(self.missing(name)),
        }
    }

    /// The tensor `name`, checked to have the model's shape and dtype; `Err` naming the
    /// file, the tensor and both shapes and dtypes when it does not.
    pub fn expect_shape(
        &self,
        name: &str,
        model_shape: &[usize],
        model_dtype: DType,
    ) -> Result<&Array> {
        let a = self.get(name)?;
        if a.shape() != model_shape || a.dtype() != model_dtype {
            return Err(Error::ShapeMismatch {
                path: self.path.clone(),
                tensor: name.to_string(),
                file_shape: a.shape().to_vec(),
                file_dtype: a.dtype(),
                model_shape: model_shape.to_vec(),
                model_dtype,
            });
        }
        Ok(a)
    }

    fn missing(&self, name: &str) -> Error {
        let mut names: Vec<&str> = self.tensors.keys().map(String::as_str).collect();
        names.truncate(8);
        Error::Checkpoint {
            path: self.path.clone(),
            tensor: Some(name.to_string()),
            why: format!(
                "not in the file ({} tensors; first names: {names:?})",
                self.tensors.len()
            ),
        }
    }
}

/// Writes `tensors` and `metadata` to `path` as a safetensors file, atomically (a
/// temporary file in the same directory, synced, then renamed over `path`; removed
/// again on any error).
///
/// `Err` naming the file for a repeated tensor name or an I/O failure.
pub fn save(
    path: &Path,
    tensors: &[(&str, &Array)],
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    let refuse = |tensor: Option<&str>, why: String| Error::Checkpoint {
        path: path.to_path_buf(),
        tensor: tensor.map(str::to_string),
        why,
    };
    let mut seen = std::collections::BTreeSet::new();
    for (name, _) in tensors {
        if !seen.insert(*name) {
            return Err(refuse(Some(name), "the name is given twice".into()));
        }
    }
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, a)| le_bytes(a.as_host().storage()))
        .collect();
    let mut views = Vec::with_capacity(tensors.len());
    for ((name, a), data) in tensors.iter().zip(&bytes) {
        let view = TensorView::new(dtype_to_file(a.dtype()), a.shape().to_vec(), data)
            .map_err(|e| refuse(Some(name), format!("bug: {e}")))?;
        views.push((*name, view));
    }
    let info: HashMap<String, String> = metadata.clone().into_iter().collect();
    let info = (!info.is_empty()).then_some(info);
    let file =
        safetensors::tensor::serialize(views, info).map_err(|e| refuse(None, e.to_string()))?;
    ndfuse::npy::write_atomic(path, |f| f.write_all(&file)).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Reads the safetensors file at `path`.
///
/// `Err(Error::Io)` when it cannot be read; `Err(Error::Checkpoint)` naming the file
/// (and the tensor, where one is at fault) when it is truncated, corrupt, or holds a
/// dtype ndfuse has no equivalent for (u8, i8, f8...).
pub fn load(path: &Path) -> Result<Checkpoint> {
    let bytes = fs::read(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let corrupt = |tensor: Option<&str>, why: String| Error::Checkpoint {
        path: path.to_path_buf(),
        tensor: tensor.map(str::to_string),
        why,
    };
    let file = SafeTensors::deserialize(&bytes).map_err(|e| {
        corrupt(
            None,
            format!("not a valid safetensors file ({} bytes): {e}", bytes.len()),
        )
    })?;
    let (_, header) = SafeTensors::read_metadata(&bytes)
        .map_err(|e| corrupt(None, format!("not a valid safetensors file: {e}")))?;
    let metadata: BTreeMap<String, String> = header
        .metadata()
        .as_ref()
        .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default();
    let mut tensors = BTreeMap::new();
    for (name, view) in file.iter() {
        let array = from_view(&view).map_err(|why| corrupt(Some(name), why))?;
        tensors.insert(name.to_string(), array);
    }
    Ok(Checkpoint {
        tensors,
        metadata,
        path: path.to_path_buf(),
    })
}

fn dtype_to_file(d: DType) -> Dtype {
    match d {
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        DType::I32 => Dtype::I32,
        DType::I64 => Dtype::I64,
        DType::Bool => Dtype::BOOL,
    }
}

/// The elements' little-endian bytes (bit patterns kept: NaN payloads survive).
fn le_bytes(s: &Storage) -> Vec<u8> {
    match s {
        Storage::F16(v) => v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
        Storage::BF16(v) => v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
        Storage::F32(v) => v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
        Storage::F64(v) => v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
        Storage::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Storage::I64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Storage::Bool(v) => v.iter().map(|&b| u8::from(b)).collect(),
    }
}

/// A host array from a tensor of the file; `Err` with the reason.
fn from_view(view: &TensorView<'_>) -> std::result::Result<Array, String> {
    fn words<const N: usize, T>(data: &[u8], f: impl Fn([u8; N]) -> T) -> Vec<T> {
        data.chunks_exact(N)
            .map(|c| {
                let mut w = [0u8; N];
                w.copy_from_slice(c);
                f(w)
            })
            .collect()
    }
    let data = view.data();
    let storage = match view.dtype() {
        Dtype::F16 => Storage::F16(words(data, |w| f16::from_bits(u16::from_le_bytes(w)))),
        Dtype::BF16 => Storage::BF16(words(data, |w| bf16::from_bits(u16::from_le_bytes(w)))),
        Dtype::F32 => Storage::F32(words(data, |w| f32::from_bits(u32::from_le_bytes(w)))),
        Dtype::F64 => Storage::F64(words(data, |w| f64::from_bits(u64::from_le_bytes(w)))),
        Dtype::I32 => Storage::I32(words(data, i32::from_le_bytes)),
        Dtype::I64 => Storage::I64(words(data, i64::from_le_bytes)),
        Dtype::BOOL => {
            if let Some(at) = data.iter().position(|&b| b > 1) {
                return Err(format!(
                    "byte {} of element {at} is not a bool (0 or 1)",
                    data[at]
                ));
            }
            Storage::Bool(data.iter().map(|&b| b == 1).collect())
        }
        other => return Err(format!("dtype {other:?} has no ndfuse equivalent")),
    };
    HostArray::new(Shape::from(view.shape()), storage)
        .map(Array::from_host)
        .ok_or_else(|| {
            format!(
                "{} bytes do not fill shape {:?} of {:?}",
                data.len(),
                view.shape(),
                view.dtype()
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("ndfuse-nn-atomic-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_write_failing_midway_leaves_the_old_file_and_no_temporary() {
        let dir = scratch("midway");
        let path = dir.join("model.safetensors");
        fs::write(&path, b"the previous checkpoint").unwrap();
        let err = ndfuse::npy::write_atomic(&path, |f| {
            f.write_all(b"half of the new one")?;
            Err(std::io::Error::other("disk full (simulated)"))
        })
        .unwrap_err();
        assert!(err.to_string().contains("disk full"));
        assert_eq!(fs::read(&path).unwrap(), b"the previous checkpoint");
        let left: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            left,
            ["model.safetensors"],
            "a temporary file was left behind"
        );
        ndfuse::npy::write_atomic(&path, |f| f.write_all(b"new")).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"new");
        fs::remove_dir_all(&dir).unwrap();
    }
}
