//! Hugging Face's safetensors files (a JSON header of names, dtypes, shapes and byte
//! offsets, then the raw little-endian data), memory-mapped and read in place through
//! Hugging Face's own `safetensors` crate, which checks the header and that every
//! tensor's bytes lie inside the file. A bad file is an [`Error::Format`] naming it.

use crate::error::{Error, Result};
use crate::gguf::{decode, TensorType};
use memmap2::Mmap;
use safetensors::tensor::Metadata;
use safetensors::{Dtype, SafeTensors};
use std::path::{Path, PathBuf};

/// An open safetensors file.
#[derive(Debug)]
pub struct SafetensorsFile {
    path: PathBuf,
    map: Mmap,
    /// The header's length: the data starts 8 bytes after it.
    header: usize,
    metadata: Metadata,
}

impl SafetensorsFile {
    /// Maps and checks `path`.
    ///
    /// # Errors
    /// [`Error::Io`] when it cannot be opened; [`Error::Format`] naming the file and the
    /// safetensors crate's reason when the header is malformed, the data truncated or
    /// longer than the header says.
    pub fn open(path: impl AsRef<Path>) -> Result<SafetensorsFile> {
        let (path, map) = crate::mapped::map(path)?;
        let (header, metadata) = SafeTensors::read_metadata(&map).map_err(|e| Error::Format {
            path: path.clone(),
            at: None,
            why: format!("not a valid safetensors file: {e}"),
        })?;
        Ok(SafetensorsFile {
            path,
            map,
            header,
            metadata,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The tensors' names, in the order of their data.
    pub fn names(&self) -> Vec<String> {
        self.metadata.offset_keys()
    }

    /// The shape of `name`, if the file has it.
    pub fn shape(&self, name: &str) -> Option<&[usize]> {
        self.metadata.info(name).map(|i| &i.shape[..])
    }

    /// Tensor `name` as f32 values (F32 as it is, F16 and BF16 widened exactly) and its
    /// shape.
    ///
    /// # Errors
    /// [`Error::Format`] naming the tensor when the file lacks it or its dtype is not a
    /// float of those three.
    pub fn to_f32(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        let fail = |why: String| Error::Format {
            path: self.path.clone(),
            at: Some(name.to_string()),
            why,
        };
        let info = self
            .metadata
            .info(name)
            .ok_or_else(|| fail("no such tensor in the file".into()))?;
        let start = 8 + self.header;
        let bytes = &self.map[start + info.data_offsets.0..start + info.data_offsets.1];
        let kind = match info.dtype {
            Dtype::F32 => TensorType::F32,
            Dtype::F16 => TensorType::F16,
            Dtype::BF16 => TensorType::BF16,
            other => {
                return Err(fail(format!(
                    "dtype {other:?} is not supported (F32, F16 and BF16 are)"
                )))
            }
        };
        Ok((info.shape.clone(), decode(kind, bytes)))
    }
}
