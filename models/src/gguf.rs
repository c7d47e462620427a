//! GGUF, llama.cpp's model file (versions 2 and 3): a header, metadata key/value pairs,
//! tensor descriptions, then the tensors' data at an aligned offset. The file is
//! memory-mapped and read in place; every length and offset is checked against the
//! file before it is used, so a truncated or corrupt file is an [`Error::Format`]
//! naming the file and the key or tensor at fault.
//!
//! Layout (little-endian): `"GGUF"`, `u32` version, `u64` tensor count, `u64` metadata
//! count; each metadata pair is a string key (`u64` length + UTF-8), a `u32` value type
//! and the value (arrays: element type, `u64` length, elements); each tensor is a
//! string name, `u32` rank, `u64` extents innermost first, `u32` GGML type and a `u64`
//! offset from the start of the data, which begins at the next multiple of
//! `general.alignment` (32 by default) after the descriptions.

use crate::error::{Error, Result};
use half::{bf16, f16};
use memmap2::Mmap;
use ndfuse_ir::quant::{BlockFormat, BLOCK};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The file's first four bytes.
const MAGIC: &[u8; 4] = b"GGUF";
/// Arrays nest at most this deep (a crafted file could otherwise recurse without end).
const MAX_DEPTH: usize = 4;

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `u8`.
    U8(u8),
    /// `i8`.
    I8(i8),
    /// `u16`.
    U16(u16),
    /// `i16`.
    I16(i16),
    /// `u32`.
    U32(u32),
    /// `i32`.
    I32(i32),
    /// `f32`.
    F32(f32),
    /// A bool (one byte, 0 or 1).
    Bool(bool),
    /// A UTF-8 string.
    String(String),
    /// An array of values of one type.
    Array(Vec<Value>),
    /// `u64`.
    U64(u64),
    /// `i64`.
    I64(i64),
    /// `f64`.
    F64(f64),
}

impl Value {
    /// The value as an unsigned integer, when it is a non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float, when it is a number.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    /// The string, when the value is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The elements, when the value is an array.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// The element type of a tensor, GGML's `ggml_type` numbering.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TensorType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16.
    BF16,
    /// A block-quantised format.
    Quant(BlockFormat),
    /// A type this loader does not read (the K-quants, IQ types, integers): its GGML
    /// number. Loading such a tensor is an error naming it and the type.
    Other(u32),
}

impl TensorType {
    fn from_id(id: u32) -> TensorType {
        match id {
            0 => TensorType::F32,
            1 => TensorType::F16,
            2 => TensorType::Quant(BlockFormat::Q4_0),
            3 => TensorType::Quant(BlockFormat::Q4_1),
            8 => TensorType::Quant(BlockFormat::Q8_0),
            30 => TensorType::BF16,
            other => TensorType::Other(other),
        }
    }

    /// GGML's number of the type.
    pub fn id(self) -> u32 {
        match self {
            TensorType::F32 => 0,
            TensorType::F16 => 1,
            TensorType::Quant(BlockFormat::Q4_0) => 2,
            TensorType::Quant(BlockFormat::Q4_1) => 3,
            TensorType::Quant(BlockFormat::Q8_0) => 8,
            TensorType::BF16 => 30,
            TensorType::Other(id) => id,
        }
    }

    /// GGML's name of the type (`type 14` for one this loader does not know).
    pub fn name(self) -> String {
        match self {
            TensorType::F32 => "F32".into(),
            TensorType::F16 => "F16".into(),
            TensorType::BF16 => "BF16".into(),
            TensorType::Quant(q) => q.name().into(),
            TensorType::Other(id) => format!("type {id}"),
        }
    }

    /// The bytes of `n` elements whose innermost extent is `inner`, or why not.
    fn bytes(self, n: u64, inner: u64) -> std::result::Result<u64, String> {
        let per = |b: u64| n.checked_mul(b).ok_or_else(|| "size overflows".to_string());
        match self {
            TensorType::F32 => per(4),
            TensorType::F16 | TensorType::BF16 => per(2),
            TensorType::Quant(q) => {
                if !inner.is_multiple_of(BLOCK as u64) {
                    return Err(format!(
                        "innermost extent {inner} is not a multiple of {q:?}'s block of {BLOCK}"
                    ));
                }
                (n / BLOCK as u64)
                    .checked_mul(q.block_bytes() as u64)
                    .ok_or_else(|| "size overflows".to_string())
            }
            TensorType::Other(_) => Err(format!(
                "tensor type {} is not supported (F32, F16, BF16, Q8_0, Q4_0 and Q4_1 are)",
                self.name()
            )),
        }
    }
}

/// One tensor's description.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    /// The tensor's name (`blk.0.attn_q.weight`).
    pub name: String,
    /// The extents in GGUF's order, innermost (contiguous) first: a `[rows, cols]`
    /// matrix is `[cols, rows]` here. [`TensorInfo::shape`] gives the row-major shape.
    pub dims: Vec<u64>,
    /// The element type.
    pub kind: TensorType,
    /// The offset of the data from the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    /// The row-major shape (the GGUF extents reversed): `[rows, cols]` for a matrix.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }

    /// The number of elements.
    pub fn numel(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// An open GGUF file: its metadata and tensor descriptions, the data mapped in place.
#[derive(Debug)]
pub struct Gguf {
    path: PathBuf,
    map: Mmap,
    version: u32,
    metadata: BTreeMap<String, Value>,
    tensors: Vec<TensorInfo>,
    by_name: BTreeMap<String, usize>,
    data_start: usize,
}

impl Gguf {
    /// Maps and parses `path`: the header, the metadata and the tensor descriptions,
    /// each tensor's extent checked to lie inside the file.
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be opened or mapped; [`Error::Format`] naming
    /// the file and the key or tensor when it is not GGUF, truncated or inconsistent.
    pub fn open(path: impl AsRef<Path>) -> Result<Gguf> {
        let (path, map) = crate::mapped::map(path)?;
        Gguf::parse(path, map)
    }

    fn parse(path: PathBuf, map: Mmap) -> Result<Gguf> {
        let mut r = Reader {
            bytes: &map,
            at: 0,
            path: &path,
        };
        if r.take(4, "header")? != MAGIC {
            return Err(r.fail(None, "not a GGUF file (the first bytes are not \"GGUF\")"));
        }
        let version = r.u32("header")?;
        if !(2..=3).contains(&version) {
            return Err(r.fail(
                None,
                &format!("GGUF version {version} is not supported (2 and 3 are)"),
            ));
        }
        let n_tensors = r.u64("header")?;
        let n_kv = r.u64("header")?;
        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let key = r.string("metadata key")?;
            let kind = r.u32(&key)?;
            let value = r.value(kind, &key, 0)?;
            metadata.insert(key, value);
        }
        let alignment = match metadata.get("general.alignment") {
            None => 32,
            Some(v) => match v.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() && a <= 1 << 20 => a as usize,
                _ => {
                    return Err(r.fail(
                        Some("general.alignment"),
                        &format!("{v:?} is not a power of two"),
                    ))
                }
            },
        };
        let mut tensors = Vec::new();
        let mut by_name = BTreeMap::new();
        for _ in 0..n_tensors {
            let name = r.string("tensor name")?;
            let rank = r.u32(&name)?;
            if rank == 0 || rank > 8 {
                return Err(r.fail(Some(&name), &format!("rank {rank} (1 to 8 expected)")));
            }
            let dims = (0..rank)
                .map(|_| r.u64(&name))
                .collect::<Result<Vec<_>>>()?;
            let kind = TensorType::from_id(r.u32(&name)?);
            let offset = r.u64(&name)?;
            if !offset.is_multiple_of(alignment as u64) {
                return Err(r.fail(
                    Some(&name),
                    &format!("offset {offset} is not a multiple of the alignment {alignment}"),
                ));
            }
            if by_name.insert(name.clone(), tensors.len()).is_some() {
                return Err(r.fail(Some(&name), "the name appears twice"));
            }
            tensors.push(TensorInfo {
                name,
                dims,
                kind,
                offset,
            });
        }
        let data_start = r.at.div_ceil(alignment) * alignment;
        let gguf = Gguf {
            path,
            map,
            version,
            metadata,
            tensors,
            by_name,
            data_start,
        };
        for t in &gguf.tensors {
            if let TensorType::Other(_) = t.kind {
                continue; // Described, not readable: an error when asked for.
            }
            gguf.extent(t)?;
        }
        Ok(gguf)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Every metadata pair, by key.
    pub fn metadata(&self) -> &BTreeMap<String, Value> {
        &self.metadata
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    /// The tensor descriptions in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The description of `name`, if the file has it.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// An error about this file at `at`.
    pub fn format_error(&self, at: Option<&str>, why: impl Into<String>) -> Error {
        Error::Format {
            path: self.path.clone(),
            at: at.map(str::to_string),
            why: why.into(),
        }
    }

    /// A required integer metadata value.
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        self.get(key)
            .ok_or_else(|| self.format_error(Some(key), "missing"))?
            .as_u64()
            .ok_or_else(|| self.format_error(Some(key), "not a non-negative integer"))
    }

    /// A required float metadata value.
    pub fn get_f64(&self, key: &str) -> Result<f64> {
        self.get(key)
            .ok_or_else(|| self.format_error(Some(key), "missing"))?
            .as_f64()
            .ok_or_else(|| self.format_error(Some(key), "not a number"))
    }

    /// A required string metadata value.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        self.get(key)
            .ok_or_else(|| self.format_error(Some(key), "missing"))?
            .as_str()
            .ok_or_else(|| self.format_error(Some(key), "not a string"))
    }

    /// A required array of strings.
    pub fn get_strings(&self, key: &str) -> Result<Vec<&str>> {
        let a = self
            .get(key)
            .ok_or_else(|| self.format_error(Some(key), "missing"))?
            .as_array()
            .ok_or_else(|| self.format_error(Some(key), "not an array"))?;
        a.iter()
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| self.format_error(Some(key), "an element is not a string"))
            })
            .collect()
    }

    /// The byte range of `t`'s data inside the map.
    fn extent(&self, t: &TensorInfo) -> Result<std::ops::Range<usize>> {
        let fail = |why: String| self.format_error(Some(&t.name), why);
        let inner = t.dims.first().copied().unwrap_or(1);
        let n = t
            .dims
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .ok_or_else(|| fail(format!("extents {:?} overflow", t.dims)))?;
        let bytes = t.kind.bytes(n, inner).map_err(fail)?;
        let start = (self.data_start as u64)
            .checked_add(t.offset)
            .ok_or_else(|| fail("offset overflows".into()))?;
        let end = start
            .checked_add(bytes)
            .ok_or_else(|| fail("offset overflows".into()))?;
        if end > self.map.len() as u64 {
            return Err(fail(format!(
                "{} {:?} needs bytes {start}..{end} but the file has {} (truncated?)",
                t.kind.name(),
                t.dims,
                self.map.len()
            )));
        }
        Ok(start as usize..end as usize)
    }

    /// The raw bytes of tensor `name`, in place in the mapped file.
    ///
    /// # Errors
    /// [`Error::Format`] naming the tensor when the file lacks it or its type is not
    /// supported.
    pub fn bytes(&self, name: &str) -> Result<(&TensorInfo, &[u8])> {
        let t = self
            .tensor(name)
            .ok_or_else(|| self.format_error(Some(name), "no such tensor in the file"))?;
        let range = self.extent(t)?;
        Ok((t, &self.map[range]))
    }

    /// Tensor `name` as f32 values in row-major order ([`TensorInfo::shape`]): F32 as
    /// it is, F16 and BF16 widened exactly, quantised blocks dequantised
    /// ([`BlockFormat::dequantize`]).
    pub fn to_f32(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        let (t, bytes) = self.bytes(name)?;
        Ok((t.shape(), decode(t.kind, bytes)))
    }
}

/// The f32 values of `bytes` holding whole elements (or blocks) of `kind`: F32 as it
/// is, F16 and BF16 widened exactly, quantised blocks dequantised
/// ([`BlockFormat::dequantize`]). `kind` must not be [`TensorType::Other`] (no loader
/// hands out such bytes).
pub fn decode(kind: TensorType, bytes: &[u8]) -> Vec<f32> {
    match kind {
        TensorType::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        TensorType::F16 => bytes
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        TensorType::BF16 => bytes
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        TensorType::Quant(q) => {
            let mut out = vec![0f32; bytes.len() / q.block_bytes() * BLOCK];
            q.dequantize(bytes, &mut out);
            out
        }
        TensorType::Other(_) => unreachable!("no loader hands out bytes of other types"),
    }
}

/// A bounds-checked cursor over the file's bytes.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    path: &'a Path,
}

impl Reader<'_> {
    fn fail(&self, at: Option<&str>, why: &str) -> Error {
        Error::Format {
            path: self.path.to_path_buf(),
            at: at.map(str::to_string),
            why: why.to_string(),
        }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&[u8]> {
        match self.at.checked_add(n) {
            Some(end) if end <= self.bytes.len() => {
                let s = &self.bytes[self.at..end];
                self.at = end;
                Ok(s)
            }
            _ => Err(self.fail(
                Some(what),
                &format!(
                    "truncated: {n} bytes needed at byte {} of {}",
                    self.at,
                    self.bytes.len()
                ),
            )),
        }
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N, what)?);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.u64(what)?;
        let n = usize::try_from(n).map_err(|_| self.fail(Some(what), "string too long"))?;
        let bytes = self.take(n, what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| self.fail(Some(what), "a string is not valid UTF-8"))
    }

    fn value(&mut self, kind: u32, key: &str, depth: usize) -> Result<Value> {
        Ok(match kind {
            0 => Value::U8(self.array::<1>(key)?[0]),
            1 => Value::I8(self.array::<1>(key)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.array(key)?)),
            3 => Value::I16(i16::from_le_bytes(self.array(key)?)),
            4 => Value::U32(self.u32(key)?),
            5 => Value::I32(i32::from_le_bytes(self.array(key)?)),
            6 => Value::F32(f32::from_le_bytes(self.array(key)?)),
            7 => match self.array::<1>(key)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(self.fail(Some(key), &format!("bool byte {b} (0 or 1)"))),
            },
            8 => Value::String(self.string(key)?),
            9 => {
                if depth >= MAX_DEPTH {
                    return Err(self.fail(Some(key), "arrays nested too deep"));
                }
                let item = self.u32(key)?;
                let n = self.u64(key)?;
                // Every element takes at least one byte: a length past the end of the
                // file is corrupt, and must not reserve memory for it.
                if n > (self.bytes.len() - self.at) as u64 {
                    return Err(self.fail(
                        Some(key),
                        &format!("array of {n} elements is longer than the rest of the file"),
                    ));
                }
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(self.value(item, key, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64(key)?),
            11 => Value::I64(i64::from_le_bytes(self.array(key)?)),
            12 => Value::F64(f64::from_le_bytes(self.array(key)?)),
            other => {
                return Err(self.fail(Some(key), &format!("unknown metadata value type {other}")))
            }
        })
    }
}
