//! A model file mapped into memory, read-only: what both loaders read in place.

use crate::error::{Error, Result};
use memmap2::Mmap;
use std::fs::File;
use std::path::{Path, PathBuf};

/// `path` opened and mapped; [`Error::Io`] naming it when it cannot be.
pub(crate) fn map(path: impl AsRef<Path>) -> Result<(PathBuf, Mmap)> {
    let path = path.as_ref().to_path_buf();
    let io = |source| Error::Io {
        path: path.clone(),
        source,
    };
    let file = File::open(&path).map_err(io)?;
    // SAFETY: the map is read-only and private to the loader that holds it. Another
    // process truncating or rewriting the file while it is mapped is outside what a
    // loader can defend against (as for every mmap-based model loader: llama.cpp,
    // safetensors); within this process nothing writes to it.
    let map = unsafe { Mmap::map(&file) }.map_err(io)?;
    Ok((path, map))
}
