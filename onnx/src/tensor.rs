//! ONNX `TensorProto` to ndfuse [`Array`] and back: dtypes, raw little-endian data, the
//! typed fields, and external data files beside the model.

use crate::error::{OnnxError, Result};
use crate::proto::tensor_proto::{DataLocation, DataType};
use crate::proto::TensorProto;
use half::{bf16, f16};
use ndfuse::{Array, DType};
use prost::Message;
use std::path::Path;

/// The ndfuse dtype of an ONNX element type, or what ndfuse lacks.
pub fn dtype_of(code: i32) -> Result<DType, String> {
    let t = DataType::try_from(code).map_err(|_| format!("element type {code}"))?;
    Ok(match t {
        DataType::Float => DType::F32,
        DataType::Double => DType::F64,
        DataType::Float16 => DType::F16,
        DataType::Bfloat16 => DType::BF16,
        DataType::Int32 => DType::I32,
        DataType::Int64 => DType::I64,
        DataType::Bool => DType::Bool,
        other => return Err(format!("element type {}", other.as_str_name())),
    })
}

/// The ONNX element type of an ndfuse dtype.
pub fn onnx_type(dtype: DType) -> DataType {
    match dtype {
        DType::F32 => DataType::Float,
        DType::F64 => DataType::Double,
        DType::F16 => DataType::Float16,
        DType::BF16 => DataType::Bfloat16,
        DType::I32 => DataType::Int32,
        DType::I64 => DataType::Int64,
        DType::Bool => DataType::Bool,
    }
}

/// Reads a serialized `TensorProto` file (the backend test suite's `input_0.pb`).
pub fn read_tensor_file(path: &Path) -> Result<(String, Array)> {
    let bytes = std::fs::read(path).map_err(|e| OnnxError::Io {
        path: path.to_owned(),
        source: e.into(),
    })?;
    let t = TensorProto::decode(bytes.as_slice()).map_err(|e| OnnxError::Decode {
        what: path.display().to_string(),
        kind: "tensor",
        why: e.to_string(),
    })?;
    let a = to_array(&t, path.parent())?;
    Ok((t.name.clone().unwrap_or_default(), a))
}

/// The array a `TensorProto` holds. `dir` is where external data files are looked up
/// (the model's folder).
pub fn to_array(t: &TensorProto, dir: Option<&Path>) -> Result<Array> {
    let name = t.name.clone().unwrap_or_default();
    let bad = |why: String| OnnxError::Tensor {
        name: name.clone(),
        why,
    };
    let dtype =
        dtype_of(t.data_type.unwrap_or(0)).map_err(|w| bad(format!("{w} is not supported")))?;
    let mut shape = Vec::with_capacity(t.dims.len());
    for &d in &t.dims {
        shape.push(
            usize::try_from(d).map_err(|_| bad(format!("negative extent in dims {:?}", t.dims)))?,
        );
    }
    let count = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| bad(format!("dims {:?} overflow", t.dims)))?;
    if t.segment.is_some() {
        return Err(bad("segmented tensors are not supported".into()));
    }
    let external = t.data_location == Some(DataLocation::External as i32);
    let raw: Option<Vec<u8>> = if external {
        Some(read_external(t, dir).map_err(bad)?)
    } else {
        t.raw_data.clone()
    };
    let arr = match raw {
        Some(bytes) => from_raw(&bytes, dtype, count).map_err(bad)?,
        None => from_typed(t, dtype, count).map_err(bad)?,
    };
    let make = |r: ndfuse::Result<Array>| r.map_err(|e| bad(e.to_string()));
    let a = match arr {
        Typed::F16(v) => make(Array::from_vec(v, &shape))?,
        Typed::Bf16(v) => make(Array::from_vec(v, &shape))?,
        Typed::F32(v) => make(Array::from_vec(v, &shape))?,
        Typed::F64(v) => make(Array::from_vec(v, &shape))?,
        Typed::I32(v) => make(Array::from_vec(v, &shape))?,
        Typed::I64(v) => make(Array::from_vec(v, &shape))?,
        Typed::Bool(v) => make(Array::from_vec(v, &shape))?,
    };
    Ok(a)
}

enum Typed {
    F16(Vec<f16>),
    Bf16(Vec<bf16>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    Bool(Vec<bool>),
}

fn from_raw(bytes: &[u8], dtype: DType, count: usize) -> Result<Typed, String> {
    let size = dtype.size_bytes();
    if bytes.len() != count * size {
        return Err(format!(
            "raw data holds {} bytes, the shape needs {count} {dtype} elements ({} bytes)",
            bytes.len(),
            count * size
        ));
    }
    macro_rules! words {
        ($n:literal, $f:expr) => {
            bytes
                .chunks_exact($n)
                .map(|c| $f(c.try_into().expect("chunk size")))
                .collect()
        };
    }
    Ok(match dtype {
        DType::F16 => Typed::F16(words!(2, |c: [u8; 2]| f16::from_bits(u16::from_le_bytes(
            c
        )))),
        DType::BF16 => Typed::Bf16(words!(2, |c: [u8; 2]| bf16::from_bits(u16::from_le_bytes(
            c
        )))),
        DType::F32 => Typed::F32(words!(4, f32::from_le_bytes)),
        DType::F64 => Typed::F64(words!(8, f64::from_le_bytes)),
        DType::I32 => Typed::I32(words!(4, i32::from_le_bytes)),
        DType::I64 => Typed::I64(words!(8, i64::from_le_bytes)),
        DType::Bool => Typed::Bool(bytes.iter().map(|&b| b != 0).collect()),
    })
}

fn from_typed(t: &TensorProto, dtype: DType, count: usize) -> Result<Typed, String> {
    let check = |n: usize, field: &str| {
        if n == count {
            Ok(())
        } else {
            Err(format!("{field} holds {n} values, the shape needs {count}"))
        }
    };
    Ok(match dtype {
        DType::F32 => {
            check(t.float_data.len(), "float_data")?;
            Typed::F32(t.float_data.clone())
        }
        DType::F64 => {
            check(t.double_data.len(), "double_data")?;
            Typed::F64(t.double_data.clone())
        }
        DType::I64 => {
            check(t.int64_data.len(), "int64_data")?;
            Typed::I64(t.int64_data.clone())
        }
        DType::I32 => {
            check(t.int32_data.len(), "int32_data")?;
            Typed::I32(t.int32_data.clone())
        }
        // f16, bf16 and bool travel in int32_data, one value per entry (the low bits).
        DType::F16 => {
            check(t.int32_data.len(), "int32_data")?;
            Typed::F16(
                t.int32_data
                    .iter()
                    .map(|&w| f16::from_bits(w as u16))
                    .collect(),
            )
        }
        DType::BF16 => {
            check(t.int32_data.len(), "int32_data")?;
            Typed::Bf16(
                t.int32_data
                    .iter()
                    .map(|&w| bf16::from_bits(w as u16))
                    .collect(),
            )
        }
        DType::Bool => {
            check(t.int32_data.len(), "int32_data")?;
            Typed::Bool(t.int32_data.iter().map(|&w| w != 0).collect())
        }
    })
}

/// The bytes of a tensor stored outside the model (`location`, `offset`, `length`).
fn read_external(t: &TensorProto, dir: Option<&Path>) -> Result<Vec<u8>, String> {
    let entry = |key: &str| {
        t.external_data
            .iter()
            .find(|e| e.key.as_deref() == Some(key))
            .and_then(|e| e.value.clone())
    };
    let location = entry("location").ok_or("external data without a location")?;
    let rel = Path::new(&location);
    if rel.is_absolute()
        || rel
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err(format!(
            "external data location '{location}' leaves the model's folder"
        ));
    }
    let path = dir.unwrap_or(Path::new(".")).join(rel);
    let bytes =
        std::fs::read(&path).map_err(|e| format!("external data {}: {e}", path.display()))?;
    let num = |key: &str| -> Result<Option<usize>, String> {
        entry(key)
            .map(|v| {
                v.parse::<usize>()
                    .map_err(|_| format!("external data {key} '{v}' is not a size"))
            })
            .transpose()
    };
    let offset = num("offset")?.unwrap_or(0);
    let end = match num("length")? {
        Some(n) => offset
            .checked_add(n)
            .ok_or("external data range overflows")?,
        None => bytes.len(),
    };
    bytes.get(offset..end).map(<[u8]>::to_vec).ok_or_else(|| {
        format!(
            "external data {}: bytes {offset}..{end} of {}",
            path.display(),
            bytes.len()
        )
    })
}

/// A `TensorProto` holding `a` as raw data (for writing test data and fixtures).
pub fn from_array(name: &str, a: &Array) -> TensorProto {
    let h = a.as_host();
    let n = h.len();
    let mut raw = Vec::with_capacity(n * a.dtype().size_bytes());
    let s = h.storage();
    use ndfuse_ir::Storage;
    match s {
        Storage::F16(v) => v.iter().for_each(|x| raw.extend(x.to_bits().to_le_bytes())),
        Storage::BF16(v) => v.iter().for_each(|x| raw.extend(x.to_bits().to_le_bytes())),
        Storage::F32(v) => v.iter().for_each(|x| raw.extend(x.to_le_bytes())),
        Storage::F64(v) => v.iter().for_each(|x| raw.extend(x.to_le_bytes())),
        Storage::I32(v) => v.iter().for_each(|x| raw.extend(x.to_le_bytes())),
        Storage::I64(v) => v.iter().for_each(|x| raw.extend(x.to_le_bytes())),
        Storage::Bool(v) => v.iter().for_each(|&x| raw.push(u8::from(x))),
    }
    TensorProto {
        dims: a.shape().iter().map(|&d| d as i64).collect(),
        data_type: Some(onnx_type(a.dtype()) as i32),
        name: Some(name.to_owned()),
        raw_data: Some(raw),
        ..Default::default()
    }
}
