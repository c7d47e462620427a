//! `.npy` files in and out of the library: [`read_npy`] / [`write_npy`], and the
//! conveniences [`Context::load_npy`], [`Tensor::load_npy`] and [`Array::save_npy`].
//!
//! Format versions 1, 2 and 3 are read: f16, f32, f64, i32, i64 and bool, either byte
//! order, C or Fortran order (Fortran data is reordered to row-major, which is what an
//! [`Array`] holds). Writing produces version 1.0 (2.0 for a huge header),
//! little-endian, C order.
//!
//! Hand-written rather than taken from a crate: the format is small, and every
//! malformed file must give an error, never a panic. (The `npyz` crate, for one,
//! overflows computing the element count of a corrupt shape such as
//! `(4294967296, 4294967296, 16)` and panics in debug builds.)
//!
//! ```
//! use ndfuse::{npy, Context};
//! let dir = std::env::temp_dir().join(format!("ndfuse-npy-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! let ctx = Context::new();
//! let y = (ctx.arange(0.0, 6.0, 1.0)?.reshape(&[2, 3]) * 2.0).eval()?;
//! y.save_npy(dir.join("y.npy"))?;                  // atomic: complete or absent
//! let back = ctx.load_npy(dir.join("y.npy"))?;      // a leaf tensor
//! assert_eq!(back.eval()?, y);
//! assert_eq!(npy::read_npy(dir.join("y.npy"))?.to_vec::<f32>()?, [0., 2., 4., 6., 8., 10.]);
//! # std::fs::remove_dir_all(&dir).ok();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::array::Array;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use half::f16;
use ndfuse_ir::{DType, HostArray, Shape, Storage};
use std::fmt::Write as _;
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// Reads the `.npy` file at `path` into a row-major [`Array`].
///
/// `Err(Error::Io)` when the file cannot be read, `Err(Error::Npy)` when it is not a
/// well-formed `.npy` of a dtype ndfuse has (the reason says which byte or field).
pub fn read_npy(path: impl AsRef<Path>) -> Result<Array> {
    let path = path.as_ref();
    // `fs::read` reserves the file's size fallibly: a file too large for the memory is
    // an error of kind `OutOfMemory`, not an abort.
    let bytes = fs::read(path).map_err(|e| read_error(path, e))?;
    parse(&bytes).map(Array).map_err(|r| match r {
        Refused::Corrupt(why) => Error::Npy {
            path: path.to_path_buf(),
            why,
        },
        Refused::OutOfMemory { bytes } => Error::OutOfMemory {
            bytes: bytes as u128,
            what: format!("the array of {}", path.display()),
        },
    })
}

/// Why a file's bytes give no array.
#[derive(Debug, PartialEq)]
enum Refused {
    /// Not a well-formed `.npy` of a dtype ndfuse has: the reason, in one line.
    Corrupt(String),
    /// The decoded array (`bytes`, at most the file's size) could not be allocated.
    OutOfMemory {
        /// The size asked for.
        bytes: usize,
    },
}

impl From<String> for Refused {
    fn from(why: String) -> Refused {
        Refused::Corrupt(why)
    }
}

impl From<&str> for Refused {
    fn from(why: &str) -> Refused {
        Refused::Corrupt(why.to_string())
    }
}

/// The items of `it` in a vector allocated fallibly (`None` when the memory is short):
/// the length comes from a file's header, checked against the file's size first.
fn try_collect<T>(it: impl ExactSizeIterator<Item = T>) -> Option<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(it.len()).ok()?;
    v.extend(it);
    Some(v)
}

/// Writes `array` to `path` as `.npy`, atomically: the data goes to a temporary file in
/// the same directory, is flushed to disk (fsync), and only then renamed over `path`,
/// so `path` is either untouched or complete, never partial.
///
/// `Err(Error::Npy)` for a bf16 array (numpy has no bf16 dtype: cast it first),
/// `Err(Error::Io)` when the file cannot be written.
pub fn write_npy(path: impl AsRef<Path>, array: &Array) -> Result<()> {
    let path = path.as_ref();
    let bytes = to_bytes(array.as_host()).map_err(|why| Error::Npy {
        path: path.to_path_buf(),
        why,
    })?;
    write_atomic(path, |f| f.write_all(&bytes)).map_err(|e| io_error("write", path, e))
}

/// Why reading `path` failed: memory for its bytes that could not be had is
/// [`Error::OutOfMemory`] for the file's size, anything else [`Error::Io`].
fn read_error(path: &Path, e: std::io::Error) -> Error {
    if e.kind() == std::io::ErrorKind::OutOfMemory {
        return Error::OutOfMemory {
            // Without the size (the file went away meanwhile), more than any.
            bytes: fs::metadata(path).map_or(u128::MAX, |m| u128::from(m.len())),
            what: format!("the file {}", path.display()),
        };
    }
    io_error("read", path, e)
}

fn io_error(action: &'static str, path: &Path, e: std::io::Error) -> Error {
    Error::Io {
        action,
        path: path.to_path_buf(),
        source: Arc::new(e),
    }
}

impl Context {
    /// A leaf tensor holding the `.npy` file at `path` (see [`read_npy`]).
    pub fn load_npy(&self, path: impl AsRef<Path>) -> Result<Tensor> {
        // Moved into the leaf, not copied: the array may be as large as the memory.
        Ok(Tensor::leaf(self, read_npy(path)?.0))
    }
}

impl Tensor {
    /// A leaf tensor in the global context holding the `.npy` file at `path`.
    pub fn load_npy(path: impl AsRef<Path>) -> Result<Tensor> {
        Context::global().load_npy(path)
    }
}

impl Array {
    /// Writes this array to `path` as `.npy`, atomically (see [`write_npy`]).
    pub fn save_npy(&self, path: impl AsRef<Path>) -> Result<()> {
        write_npy(path, self)
    }
}

/// The header fields ndfuse needs.
#[derive(Debug, PartialEq)]
struct Header {
    dtype: DType,
    big_endian: bool,
    fortran: bool,
    shape: Vec<usize>,
}

/// Parses a whole `.npy` file held in memory.
/// The header's shape is checked against the file's size before anything is allocated,
/// so a header claiming a huge shape is a truncated file, not an allocation.
fn parse(bytes: &[u8]) -> Result<HostArray, Refused> {
    if bytes.len() < 8 || &bytes[..6] != MAGIC {
        return Err(Refused::Corrupt(
            "not a .npy file (it does not start with the \\x93NUMPY magic bytes)".into(),
        ));
    }
    let (major, minor) = (bytes[6], bytes[7]);
    let (len_size, utf8) = match major {
        1 => (2, false),
        2 => (4, false),
        3 => (4, true),
        _ => return Err(format!("unsupported .npy format version {major}.{minor}").into()),
    };
    let len_end = 8 + len_size;
    let len_bytes = bytes
        .get(8..len_end)
        .ok_or("corrupt .npy: the file ends inside the header length")?;
    let header_len = len_bytes
        .iter()
        .rev()
        .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
    let header_bytes = bytes.get(len_end..len_end + header_len).ok_or_else(|| {
        format!(
            "corrupt .npy: the header says it is {header_len} bytes long but the file ends first"
        )
    })?;
    let text = if utf8 {
        std::str::from_utf8(header_bytes)
            .map_err(|_| "corrupt .npy: the header is not valid UTF-8".to_string())?
            .to_string()
    } else {
        // Versions 1 and 2 are latin-1; every valid header is ASCII anyway.
        header_bytes.iter().map(|&b| char::from(b)).collect()
    };
    let header = parse_header(&text).map_err(|e| format!("corrupt .npy header: {e}"))?;
    let data = &bytes[len_end + header_len..];
    let count = header
        .shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .and_then(|n| n.checked_mul(header.dtype.size_bytes()).map(|b| (n, b)));
    let Some((count, need)) = count else {
        return Err(Refused::Corrupt(format!(
            "corrupt .npy: shape {} is too large to address",
            shape_text(&header.shape)
        )));
    };
    if data.len() < need {
        return Err(Refused::Corrupt(format!(
            "corrupt .npy: truncated: header says {}{} ({need} bytes of data) but the file holds {} bytes",
            header.dtype,
            shape_text(&header.shape),
            data.len()
        )));
    }
    if data.len() > need {
        return Err(Refused::Corrupt(format!(
            "corrupt .npy: {} unexpected bytes after the {need} bytes of {}{}",
            data.len() - need,
            header.dtype,
            shape_text(&header.shape)
        )));
    }
    let storage = decode(header.dtype, header.big_endian, data, count)?;
    let storage = if header.fortran {
        fortran_to_c(storage, &header.shape).ok_or(Refused::OutOfMemory { bytes: need })?
    } else {
        storage
    };
    HostArray::new(Shape(header.shape), storage).ok_or_else(|| {
        Refused::Corrupt("internal error: decoded element count differs from the shape".into())
    })
}

fn decode(dtype: DType, big: bool, data: &[u8], count: usize) -> Result<Storage, Refused> {
    let oom = Refused::OutOfMemory { bytes: data.len() };
    macro_rules! words {
        ($t:ty, $n:literal) => {
            try_collect(data.chunks_exact($n).map(|c| {
                let mut w = [0u8; $n];
                w.copy_from_slice(c);
                if big {
                    <$t>::from_be_bytes(w)
                } else {
                    <$t>::from_le_bytes(w)
                }
            }))
            .ok_or(oom)?
        };
    }
    Ok(match dtype {
        DType::F16 => Storage::F16(words!(u16, 2).into_iter().map(f16::from_bits).collect()),
        DType::F32 => Storage::F32(words!(f32, 4)),
        DType::F64 => Storage::F64(words!(f64, 8)),
        DType::I32 => Storage::I32(words!(i32, 4)),
        DType::I64 => Storage::I64(words!(i64, 8)),
        DType::Bool => {
            if let Some(i) = data.iter().position(|&b| b > 1) {
                return Err(Refused::Corrupt(format!(
                    "corrupt .npy: bool element {i} is the byte {:#04x}, not 0 or 1",
                    data[i]
                )));
            }
            Storage::Bool(try_collect(data.iter().map(|&b| b == 1)).ok_or(oom)?)
        }
        // parse_descr never yields bf16 (numpy has no bf16), but a corrupt file must
        // not be able to reach a panic, so this is an error like any other.
        DType::BF16 => return Err("bf16 is not a numpy dtype".into()),
    })
    .inspect(|s| debug_assert_eq!(s.len(), count, "decoded element count"))
}

/// Reorders column-major data (first axis fastest) to row-major; `None` when the
/// memory for the reordered copy is short.
fn fortran_to_c(s: Storage, shape: &[usize]) -> Option<Storage> {
    fn reorder<T: Copy>(v: Vec<T>, shape: &[usize]) -> Option<Vec<T>> {
        let rank = shape.len();
        if rank < 2 || v.is_empty() {
            return Some(v);
        }
        // Offset of element (i0, .., in-1) in the file is sum(ik * fstride[k]).
        let mut fstride = vec![1usize; rank];
        for k in 1..rank {
            fstride[k] = fstride[k - 1] * shape[k - 1];
        }
        let mut out = Vec::new();
        out.try_reserve_exact(v.len()).ok()?;
        let mut idx = vec![0usize; rank];
        let mut off = 0usize;
        for _ in 0..v.len() {
            out.push(v[off]);
            // Advance the row-major index (last axis fastest), keeping `off` in step.
            for k in (0..rank).rev() {
                idx[k] += 1;
                off += fstride[k];
                if idx[k] < shape[k] {
                    break;
                }
                off -= fstride[k] * shape[k];
                idx[k] = 0;
            }
        }
        Some(out)
    }
    Some(match s {
        Storage::F16(v) => Storage::F16(reorder(v, shape)?),
        Storage::BF16(v) => Storage::BF16(reorder(v, shape)?),
        Storage::F32(v) => Storage::F32(reorder(v, shape)?),
        Storage::F64(v) => Storage::F64(reorder(v, shape)?),
        Storage::I32(v) => Storage::I32(reorder(v, shape)?),
        Storage::I64(v) => Storage::I64(reorder(v, shape)?),
        Storage::Bool(v) => Storage::Bool(reorder(v, shape)?),
    })
}

fn shape_text(shape: &[usize]) -> String {
    let dims: Vec<String> = shape.iter().map(ToString::to_string).collect();
    format!("[{}]", dims.join(","))
}

/// A value of the Python literal subset `.npy` headers use.
#[derive(Debug, PartialEq)]
enum Py {
    Str(String),
    Int(u64),
    Bool(bool),
    Tuple(Vec<Py>),
    List(Vec<Py>),
    Dict(Vec<(Py, Py)>),
}

/// How deep brackets may nest in a header: numpy's own nest two levels (a dict holding a
/// tuple), structured dtypes a few more. Deeper text is refused, so that a header of
/// 64 KiB (v1) or 4 GiB (v2) of `[` cannot overflow the stack of the recursive parser.
const MAX_HEADER_NESTING: usize = 32;

struct PyParser<'a> {
    s: &'a [u8],
    i: usize,
    /// Open brackets around the value being parsed.
    depth: usize,
}

impl PyParser<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) -> bool {
        self.ws();
        if self.s.get(self.i) == Some(&c) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    fn here(&self) -> String {
        match self.s.get(self.i) {
            Some(&c) => format!("'{}' at byte {}", char::from(c), self.i),
            None => "the end of the header".into(),
        }
    }

    /// Items up to `close`, separated by commas, trailing comma allowed.
    fn seq(&mut self, close: u8) -> Result<Vec<Py>, String> {
        let mut items = Vec::new();
        loop {
            if self.eat(close) {
                return Ok(items);
            }
            items.push(self.value()?);
            if !self.eat(b',') {
                if self.eat(close) {
                    return Ok(items);
                }
                return Err(format!(
                    "expected ',' or '{}', found {}",
                    char::from(close),
                    self.here()
                ));
            }
        }
    }

    fn value(&mut self) -> Result<Py, String> {
        if self.depth >= MAX_HEADER_NESTING {
            return Err(format!(
                "brackets nested deeper than {MAX_HEADER_NESTING} levels at byte {}",
                self.i
            ));
        }
        self.depth += 1;
        let v = self.value_within();
        self.depth -= 1;
        v
    }

    fn value_within(&mut self) -> Result<Py, String> {
        self.ws();
        let Some(&c) = self.s.get(self.i) else {
            return Err("the header ends where a value was expected".into());
        };
        match c {
            b'\'' | b'"' => {
                let start = self.i + 1;
                let end = self.s[start..]
                    .iter()
                    .position(|&b| b == c)
                    .ok_or("unterminated string")?;
                self.i = start + end + 1;
                Ok(Py::Str(
                    String::from_utf8_lossy(&self.s[start..start + end]).into_owned(),
                ))
            }
            b'0'..=b'9' => {
                let start = self.i;
                while self.i < self.s.len() && self.s[self.i].is_ascii_digit() {
                    self.i += 1;
                }
                let text =
                    std::str::from_utf8(&self.s[start..self.i]).map_err(|e| e.to_string())?;
                // Python 2 wrote longs as `3L`.
                if self.s.get(self.i) == Some(&b'L') {
                    self.i += 1;
                }
                text.parse::<u64>()
                    .map(Py::Int)
                    .map_err(|_| format!("dimension {text} is too large"))
            }
            b'(' => {
                self.i += 1;
                self.seq(b')').map(Py::Tuple)
            }
            b'[' => {
                self.i += 1;
                self.seq(b']').map(Py::List)
            }
            b'{' => {
                self.i += 1;
                let mut entries = Vec::new();
                loop {
                    if self.eat(b'}') {
                        return Ok(Py::Dict(entries));
                    }
                    let k = self.value()?;
                    if !self.eat(b':') {
                        return Err(format!(
                            "expected ':' in the header dict, found {}",
                            self.here()
                        ));
                    }
                    let v = self.value()?;
                    entries.push((k, v));
                    if !self.eat(b',') {
                        if self.eat(b'}') {
                            return Ok(Py::Dict(entries));
                        }
                        return Err(format!(
                            "expected ',' or '}}' in the header dict, found {}",
                            self.here()
                        ));
                    }
                }
            }
            _ => {
                for (word, v) in [("True", true), ("False", false)] {
                    if self.s[self.i..].starts_with(word.as_bytes()) {
                        self.i += word.len();
                        return Ok(Py::Bool(v));
                    }
                }
                Err(format!("unexpected {}", self.here()))
            }
        }
    }
}

fn parse_header(text: &str) -> Result<Header, String> {
    let mut p = PyParser {
        s: text.as_bytes(),
        i: 0,
        depth: 0,
    };
    let Py::Dict(entries) = p.value()? else {
        return Err("the header is not a dict".into());
    };
    p.ws();
    if p.i != p.s.len() {
        return Err(format!("unexpected {} after the header dict", p.here()));
    }
    let get = |key: &str| {
        entries
            .iter()
            .find(|(k, _)| matches!(k, Py::Str(s) if s == key))
            .map(|(_, v)| v)
            .ok_or_else(|| format!("the header has no '{key}' key"))
    };
    let (dtype, big_endian) = match get("descr")? {
        Py::Str(d) => parse_descr(d)?,
        _ => return Err("structured arrays (a list 'descr') are not supported".into()),
    };
    let fortran = match get("fortran_order")? {
        Py::Bool(b) => *b,
        _ => return Err("'fortran_order' is not True or False".into()),
    };
    let shape = match get("shape")? {
        Py::Tuple(dims) => dims
            .iter()
            .map(|d| match d {
                Py::Int(v) => {
                    usize::try_from(*v).map_err(|_| format!("dimension {v} is too large"))
                }
                _ => Err("'shape' holds something other than non-negative integers".to_string()),
            })
            .collect::<Result<Vec<_>, _>>()?,
        _ => return Err("'shape' is not a tuple".into()),
    };
    Ok(Header {
        dtype,
        big_endian,
        fortran,
        shape,
    })
}

/// `<f4` -> (f32, little-endian). Names numpy's dtype in the refusal of the others.
fn parse_descr(d: &str) -> Result<(DType, bool), String> {
    let (order, code) = match d.chars().next() {
        Some(c @ ('<' | '>' | '|' | '=')) => (c, &d[1..]),
        _ => ('=', d),
    };
    let big = match order {
        '>' => true,
        '<' => false,
        _ => cfg!(target_endian = "big"),
    };
    let dtype = match code {
        "f2" => DType::F16,
        "f4" => DType::F32,
        "f8" => DType::F64,
        "i4" => DType::I32,
        "i8" => DType::I64,
        "b1" | "?" => DType::Bool,
        _ => {
            let numpy = match code {
                "u1" => " (uint8)",
                "i1" => " (int8)",
                "u2" => " (uint16)",
                "i2" => " (int16)",
                "u4" => " (uint32)",
                "u8" => " (uint64)",
                "c8" => " (complex64)",
                "c16" => " (complex128)",
                "f16" | "f12" => " (longdouble)",
                "O" => " (object, pickled)",
                _ => "",
            };
            return Err(format!(
                "unsupported dtype '{d}'{numpy}: ndfuse reads f16, f32, f64, i32, i64 and bool"
            ));
        }
    };
    Ok((dtype, big))
}

/// The `.npy` bytes of a row-major array: version 1.0 (2.0 for a header longer than
/// 65535 bytes), little-endian, C order, header padded to a multiple of 64 bytes.
/// `Err` for bf16, which numpy has no dtype for.
fn to_bytes(array: &HostArray) -> Result<Vec<u8>, String> {
    let shape = array.shape().dims();
    let data = array.storage();
    let descr = match data {
        Storage::F16(_) => "<f2",
        Storage::F32(_) => "<f4",
        Storage::F64(_) => "<f8",
        Storage::I32(_) => "<i4",
        Storage::I64(_) => "<i8",
        Storage::Bool(_) => "|b1",
        Storage::BF16(_) => {
            return Err(
                "numpy has no bf16 dtype, so a bf16 result cannot be written to .npy: wrap the expression in cast(..., f32)"
                    .into(),
            )
        }
    };
    let mut shape_py = String::from("(");
    for (i, d) in shape.iter().enumerate() {
        let _ = write!(shape_py, "{}{d}", if i > 0 { ", " } else { "" });
    }
    if shape.len() == 1 {
        shape_py.push(',');
    }
    shape_py.push(')');
    let mut header =
        format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape_py}, }}");
    let v1 = header.len() + 11 <= usize::from(u16::MAX);
    let prefix = if v1 { 10 } else { 12 };
    while (prefix + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out =
        Vec::with_capacity(prefix + header.len() + data.len() * data.dtype().size_bytes());
    out.extend_from_slice(MAGIC);
    if v1 {
        out.extend_from_slice(&[1, 0]);
        let len = u16::try_from(header.len()).map_err(|_| "header too long".to_string())?;
        out.extend_from_slice(&len.to_le_bytes());
    } else {
        out.extend_from_slice(&[2, 0]);
        let len = u32::try_from(header.len()).map_err(|_| "header too long".to_string())?;
        out.extend_from_slice(&len.to_le_bytes());
    }
    out.extend_from_slice(header.as_bytes());
    match data {
        Storage::F16(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_bits().to_le_bytes())),
        Storage::F32(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Storage::F64(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Storage::I32(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Storage::I64(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Storage::Bool(v) => out.extend(v.iter().map(|&b| u8::from(b))),
        // Refused above; written as nothing rather than a panic.
        Storage::BF16(_) => {}
    }
    Ok(out)
}

/// Writes a file with `write` so that `path` is either untouched or complete: the data
/// goes to a temporary file in the same directory (same file system, so the rename
/// is atomic), is flushed to disk, and only then renamed over `path`. On any failure
/// the temporary file is removed.
pub fn write_atomic(
    path: &Path,
    write: impl FnOnce(&mut fs::File) -> std::io::Result<()>,
) -> std::io::Result<()> {
    use std::io::{Error as IoError, ErrorKind};
    let name = path
        .file_name()
        .ok_or_else(|| IoError::new(ErrorKind::InvalidInput, "not a file path"))?
        .to_string_lossy()
        .into_owned();
    let dir: PathBuf = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if path.is_dir() {
        return Err(IoError::new(ErrorKind::IsADirectory, "is a directory"));
    }
    // The process id keeps two processes writing the same file apart; the counter,
    // two threads of one process.
    static SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let serial = SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".{name}.{}.{serial}.tmp", std::process::id()));
    let result = (|| -> std::io::Result<()> {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        write(&mut f)?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, path)?;
        // Persist the rename itself; not every platform lets a directory be synced,
        // and the data is complete either way, so a failure here is not an error.
        if let Ok(d) = fs::File::open(&dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    result.inspect_err(|_| {
        let _ = fs::remove_file(&tmp);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(header: &str, data: &[u8]) -> Vec<u8> {
        let mut v = MAGIC.to_vec();
        v.extend_from_slice(&[1, 0]);
        v.extend_from_slice(&(header.len() as u16).to_le_bytes());
        v.extend_from_slice(header.as_bytes());
        v.extend_from_slice(data);
        v
    }

    #[test]
    fn round_trip_every_dtype() {
        let cases = [
            (
                vec![2, 3],
                Storage::F32(vec![1.0, -2.5, 3.0, 4.0, 5.0, 6.0]),
            ),
            (vec![3], Storage::F64(vec![1e300, -0.0, f64::NAN])),
            (vec![], Storage::I64(vec![-7])),
            (vec![2, 0], Storage::I32(vec![])),
            (vec![2, 2], Storage::Bool(vec![true, false, false, true])),
            (vec![1], Storage::F16(vec![f16::from_f32(0.5)])),
        ];
        for (shape, data) in cases {
            let a = HostArray::new(Shape(shape), data).expect("count matches");
            let bytes = to_bytes(&a).expect("writes");
            assert_eq!(
                bytes.iter().position(|&b| b == b'\n').map(|p| (p + 1) % 64),
                Some(0)
            );
            let back = parse(&bytes).expect("reads back");
            assert_eq!(back.shape(), a.shape());
            // NaN != NaN, so compare bit patterns through the writer.
            assert_eq!(to_bytes(&back), Ok(bytes));
        }
        let bf = HostArray::new(Shape(vec![1]), Storage::BF16(vec![half::bf16::ONE]));
        assert!(to_bytes(&bf.expect("one element")).is_err());
    }

    /// A fresh folder under the system temp dir for one test.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir()
            .join(format!("ndfuse-npy-{}", std::process::id()))
            .join(name);
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("scratch folder");
        dir
    }

    #[test]
    fn files_round_trip_every_dtype_through_the_public_api() {
        let dir = scratch("files");
        let arrays = [
            Storage::F16(vec![f16::from_f32(-1.5), f16::INFINITY, f16::from_f32(0.1)]),
            Storage::F32(vec![1.0, f32::NAN, -0.0]),
            Storage::F64(vec![1e-300, f64::NEG_INFINITY, 3.25]),
            Storage::I32(vec![i32::MIN, 0, i32::MAX]),
            Storage::I64(vec![i64::MIN, -1, i64::MAX]),
            Storage::Bool(vec![true, false, true]),
        ];
        for data in arrays {
            let dtype = data.dtype();
            let a = Array(HostArray::new(Shape(vec![3, 1]), data).expect("3 elements"));
            let path = dir.join(format!("{dtype}.npy"));
            a.save_npy(&path).expect("saves");
            let back = read_npy(&path).expect("reads");
            assert_eq!(back.dtype(), dtype);
            assert_eq!(back.shape(), &[3, 1]);
            assert_eq!(
                to_bytes(back.as_host()),
                to_bytes(a.as_host()),
                "{dtype}: bits"
            );
            // Through a tensor: the loaded leaf evaluates to the same bits.
            let t = Context::new().load_npy(&path).expect("loads");
            let evaluated = t.eval().expect("evaluates");
            assert_eq!(to_bytes(evaluated.as_host()), to_bytes(a.as_host()));
        }
        // Nothing but the six files: no temporary file is left behind.
        assert_eq!(fs::read_dir(&dir).expect("dir").count(), 6);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_file_too_large_for_memory_is_out_of_memory() {
        // `fs::read` reports a failed reservation of the file's size as this kind; a
        // file larger than the memory cannot be made portably, so the kind is given.
        let dir = scratch("oom");
        let path = dir.join("big.npy");
        fs::write(&path, [0u8; 300]).expect("write");
        let e = read_error(&path, std::io::ErrorKind::OutOfMemory.into());
        assert!(
            matches!(&e, Error::OutOfMemory { bytes: 300, what } if what.contains("big.npy")),
            "{e:?}"
        );
        assert!(
            e.to_string()
                .starts_with("out of memory: 300 bytes for the file "),
            "{e}"
        );
        let e = read_error(&path, std::io::ErrorKind::PermissionDenied.into());
        assert!(matches!(&e, Error::Io { action: "read", .. }), "{e:?}");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn file_errors_are_values_that_name_the_file() {
        let dir = scratch("errors");
        let missing = dir.join("missing.npy");
        let e = read_npy(&missing).expect_err("no such file");
        assert!(matches!(&e, Error::Io { action: "read", path, .. } if path == &missing));
        assert!(e.to_string().starts_with("cannot read "), "{e}");
        assert!(!e.to_string().contains("os error"), "{e}");

        let bad = dir.join("bad.npy");
        fs::write(&bad, b"\x93NUMPY\x01\x00\x10\x00{'descr': '<f4'").expect("write");
        let e = read_npy(&bad).expect_err("corrupt");
        assert!(
            matches!(&e, Error::Npy { path, .. } if path == &bad),
            "{e:?}"
        );

        let bf = Array(
            HostArray::new(Shape(vec![]), Storage::BF16(vec![half::bf16::ONE])).expect("scalar"),
        );
        let out = dir.join("bf.npy");
        let e = bf.save_npy(&out).expect_err("bf16");
        assert!(e.to_string().contains("numpy has no bf16 dtype"), "{e}");
        let e = write_npy(&dir, &bf).expect_err("bf16 is refused before the path is looked at");
        assert!(matches!(e, Error::Npy { .. }));
        let f = Array(HostArray::new(Shape(vec![]), Storage::F32(vec![1.0])).expect("scalar"));
        let e = write_npy(&dir, &f).expect_err("a directory");
        assert!(e.to_string().ends_with("is a directory"), "{e}");
        let e = write_npy(dir.join("no/such/dir/x.npy"), &f).expect_err("no folder");
        assert!(matches!(
            e,
            Error::Io {
                action: "write",
                ..
            }
        ));
        assert_eq!(fs::read_dir(&dir).expect("dir").count(), 1, "only bad.npy");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn fortran_order_and_big_endian() {
        // numpy: np.asfortranarray(np.arange(6, dtype='>i4').reshape(2, 3))
        let data: Vec<u8> = [0i32, 3, 1, 4, 2, 5]
            .iter()
            .flat_map(|v| v.to_be_bytes())
            .collect();
        let f = file(
            "{'descr': '>i4', 'fortran_order': True, 'shape': (2, 3), }\n",
            &data,
        );
        let a = parse(&f).expect("reads");
        assert_eq!(a.storage(), &Storage::I32(vec![0, 1, 2, 3, 4, 5]));
        let data: Vec<u8> = (0..24i64).flat_map(|v| v.to_le_bytes()).collect();
        let f = file(
            "{'descr': '<i8', 'fortran_order': True, 'shape': (2L, 3L, 4L), }",
            &data,
        );
        let a = parse(&f).expect("reads");
        assert_eq!(a.shape().dims(), &[2, 3, 4]);
        let Storage::I64(v) = a.storage() else {
            panic!("i64")
        };
        // Row-major element (i, j, k) is file element i + 2j + 6k.
        assert_eq!(v[12 + 2 * 4 + 3], 1 + 2 * 2 + 6 * 3);
    }

    #[test]
    fn corrupt_files_are_errors() {
        let ok = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }";
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (b"hello".to_vec(), "magic"),
            (b"\x93NUMPY\x09\x00\x10\x00".to_vec(), "version 9.0"),
            (b"\x93NUMPY\x01\x00\xff\x00{".to_vec(), "file ends first"),
            (file(ok, &[0; 7]), "truncated"),
            (file(ok, &[0; 9]), "1 unexpected bytes"),
            (file("{'descr': '<u1', 'fortran_order': False, 'shape': (2,), }", &[0; 2]), "uint8"),
            (file("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }", &[0; 8]), "structured"),
            (file("{'descr': '<f4', 'shape': (2,), }", &[0; 8]), "fortran_order"),
            (file("{'descr': '<f4', 'fortran_order': False, 'shape': (2,) ", &[0; 8]), "expected"),
            (file("{'descr': '<f4', 'fortran_order': 1, 'shape': (2,), }", &[0; 8]), "True or False"),
            (file("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }", &[0; 8]), "unexpected"),
            (
                file("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 16), }", &[]),
                "too large",
            ),
            (
                file("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999999,), }", &[]),
                "too large",
            ),
            // 80 GB claimed by 16 bytes: refused against the file's size, before any
            // allocation (issue 18).
            (
                file("{'descr': '<f8', 'fortran_order': True, 'shape': (100000, 100000), }", &[0; 16]),
                "truncated: header says f64[100000,100000] (80000000000 bytes of data)",
            ),
            (file("{'descr': '|b1', 'fortran_order': False, 'shape': (2,), }", &[1, 2]), "0x02"),
            (file("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), } x", &[0; 8]), "after the header"),
            (file("{'descr': '<f4", &[]), "unterminated"),
        ];
        for (bytes, want) in cases {
            match parse(&bytes) {
                Ok(a) => panic!("expected an error containing {want:?}, got {a:?}"),
                Err(Refused::Corrupt(e)) => {
                    assert!(e.contains(want), "{e:?} should contain {want:?}")
                }
                Err(other) => panic!("expected an error containing {want:?}, got {other:?}"),
            }
        }
    }
}
