//! The GGUF and safetensors loaders against files these tests write themselves: every
//! tensor type and metadata kind, a non-default alignment, and corrupt and truncated
//! variants (each an error naming the file and, where one is at fault, the key or
//! tensor; never a panic). Dequantisation is checked bit for bit against the block
//! formats' definitions written here from the GGUF specification.

use half::{bf16, f16};
use ndfuse_models::{Error, Gguf, SafetensorsFile, TensorType, Value};
use std::path::PathBuf;

/// A GGUF file under construction (the specification's layout, little-endian).
struct Writer {
    kv: Vec<u8>,
    n_kv: u64,
    infos: Vec<u8>,
    data: Vec<u8>,
    n_tensors: u64,
    alignment: usize,
}

fn string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

impl Writer {
    fn new(alignment: usize) -> Writer {
        let mut w = Writer {
            kv: Vec::new(),
            n_kv: 0,
            infos: Vec::new(),
            data: Vec::new(),
            n_tensors: 0,
            alignment,
        };
        if alignment != 32 {
            w.kv_raw("general.alignment", 4, &(alignment as u32).to_le_bytes());
        }
        w
    }

    fn kv_raw(&mut self, key: &str, kind: u32, value: &[u8]) {
        string(&mut self.kv, key);
        self.kv.extend(kind.to_le_bytes());
        self.kv.extend(value);
        self.n_kv += 1;
    }

    fn kv_str(&mut self, key: &str, v: &str) {
        let mut b = Vec::new();
        string(&mut b, v);
        self.kv_raw(key, 8, &b);
    }

    /// A tensor of GGML type `kind` with extents `dims` (innermost first) and raw bytes.
    fn tensor(&mut self, name: &str, dims: &[u64], kind: u32, bytes: &[u8]) {
        while !self.data.len().is_multiple_of(self.alignment) {
            self.data.push(0);
        }
        string(&mut self.infos, name);
        self.infos.extend((dims.len() as u32).to_le_bytes());
        for d in dims {
            self.infos.extend(d.to_le_bytes());
        }
        self.infos.extend(kind.to_le_bytes());
        self.infos.extend((self.data.len() as u64).to_le_bytes());
        self.data.extend(bytes);
        self.n_tensors += 1;
    }

    fn bytes(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend(self.n_tensors.to_le_bytes());
        out.extend(self.n_kv.to_le_bytes());
        out.extend(&self.kv);
        out.extend(&self.infos);
        while !out.len().is_multiple_of(self.alignment) {
            out.push(0);
        }
        out.extend(&self.data);
        out
    }
}

fn temp(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ndfuse-models-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// A tiny deterministic generator.
fn bytes_of(seed: u64, n: usize) -> Vec<u8> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 33) as u8
        })
        .collect()
}

/// `n` blocks of a 4-bit or 8-bit format with finite scales.
fn blocks(kind: u32, n: usize, seed: u64) -> Vec<u8> {
    let raw = bytes_of(seed, n * 34);
    let mut out = Vec::new();
    for b in 0..n {
        let r = &raw[b * 34..(b + 1) * 34];
        let scale = |i: usize| f16::from_f32(0.01 + f32::from(r[i]) / 1000.0).to_le_bytes();
        out.extend(scale(0));
        match kind {
            8 => out.extend(&r[2..34]),
            2 => out.extend(&r[2..18]),
            _ => {
                out.extend(f16::from_f32(f32::from(r[1]) / 100.0 - 1.0).to_le_bytes());
                out.extend(&r[2..18]);
            }
        }
    }
    out
}

/// The specification's f32 dequantisation of `bytes` (type 8 Q8_0, 2 Q4_0, 3 Q4_1).
fn spec_dequant(kind: u32, bytes: &[u8]) -> Vec<f32> {
    let bb = match kind {
        8 => 34,
        2 => 18,
        _ => 20,
    };
    let mut out = Vec::new();
    for blk in bytes.chunks_exact(bb) {
        let d = f16::from_le_bytes([blk[0], blk[1]]).to_f32();
        for j in 0..32 {
            out.push(match kind {
                8 => d * f32::from(blk[2 + j] as i8),
                _ => {
                    let at = if kind == 2 { 2 } else { 4 };
                    let byte = blk[at + j % 16];
                    let q = f32::from(if j < 16 { byte & 15 } else { byte >> 4 });
                    if kind == 2 {
                        d * (q - 8.0)
                    } else {
                        d * q + f16::from_le_bytes([blk[2], blk[3]]).to_f32()
                    }
                }
            });
        }
    }
    out
}

/// A tensor of the test file: name, GGML type, extents (innermost first), bytes.
type Spec = (String, u32, Vec<u64>, Vec<u8>);

fn full_file(alignment: usize) -> (Vec<u8>, Vec<Spec>) {
    let mut w = Writer::new(alignment);
    w.kv_str("general.architecture", "llama");
    w.kv_raw("u8", 0, &[200]);
    w.kv_raw("i8", 1, &[0xff]);
    w.kv_raw("u16", 2, &513u16.to_le_bytes());
    w.kv_raw("i16", 3, &(-2i16).to_le_bytes());
    w.kv_raw("u32", 4, &70000u32.to_le_bytes());
    w.kv_raw("i32", 5, &(-3i32).to_le_bytes());
    w.kv_raw("f32", 6, &1.5f32.to_le_bytes());
    w.kv_raw("bool", 7, &[1]);
    w.kv_raw("u64", 10, &(1u64 << 40).to_le_bytes());
    w.kv_raw("i64", 11, &(-5i64).to_le_bytes());
    w.kv_raw("f64", 12, &0.25f64.to_le_bytes());
    // An array of strings and an array of arrays of u8.
    let mut a = 8u32.to_le_bytes().to_vec();
    a.extend(2u64.to_le_bytes());
    string(&mut a, "a");
    string(&mut a, "bc");
    w.kv_raw("strings", 9, &a);
    let mut nested = 9u32.to_le_bytes().to_vec();
    nested.extend(1u64.to_le_bytes());
    nested.extend(0u32.to_le_bytes());
    nested.extend(2u64.to_le_bytes());
    nested.extend([7, 8]);
    w.kv_raw("nested", 9, &nested);
    let f32s: Vec<u8> = (0..6)
        .flat_map(|i| (i as f32 * 0.5).to_le_bytes())
        .collect();
    let f16s: Vec<u8> = (0..6)
        .flat_map(|i| f16::from_f32(i as f32 - 2.5).to_le_bytes())
        .collect();
    let bf16s: Vec<u8> = (0..6)
        .flat_map(|i| bf16::from_f32(i as f32 * 3.0).to_le_bytes())
        .collect();
    // The unreadable one first: a file cut anywhere in the data cuts a readable one.
    let tensors = vec![
        ("t.q6_k".to_string(), 14, vec![256], vec![0; 210]),
        ("t.f32".to_string(), 0, vec![3, 2], f32s),
        ("t.f16".to_string(), 1, vec![6], f16s),
        ("t.bf16".to_string(), 30, vec![2, 3], bf16s),
        ("t.q8_0".to_string(), 8, vec![64, 3], blocks(8, 6, 1)),
        ("t.q4_0".to_string(), 2, vec![32, 2], blocks(2, 2, 2)),
        ("t.q4_1".to_string(), 3, vec![96, 2], blocks(3, 6, 3)),
    ];
    for (name, kind, dims, bytes) in &tensors {
        w.tensor(name, dims, *kind, bytes);
    }
    (w.bytes(), tensors)
}

#[test]
fn gguf_reads_every_tensor_type_and_metadata_kind() {
    for alignment in [32, 64] {
        let (bytes, tensors) = full_file(alignment);
        let path = temp(&format!("full{alignment}.gguf"), &bytes);
        let g = Gguf::open(&path).unwrap();
        assert_eq!(g.version(), 3);
        assert_eq!(g.get_str("general.architecture").unwrap(), "llama");
        assert_eq!(g.get("u8"), Some(&Value::U8(200)));
        assert_eq!(g.get("i8"), Some(&Value::I8(-1)));
        assert_eq!(g.get("u16"), Some(&Value::U16(513)));
        assert_eq!(g.get("i16"), Some(&Value::I16(-2)));
        assert_eq!(g.get_u64("u32").unwrap(), 70000);
        assert_eq!(g.get("i32"), Some(&Value::I32(-3)));
        assert_eq!(g.get_f64("f32").unwrap(), 1.5);
        assert_eq!(g.get("bool"), Some(&Value::Bool(true)));
        assert_eq!(g.get_u64("u64").unwrap(), 1 << 40);
        assert_eq!(g.get("i64"), Some(&Value::I64(-5)));
        assert_eq!(g.get_f64("f64").unwrap(), 0.25);
        assert_eq!(g.get_strings("strings").unwrap(), vec!["a", "bc"]);
        assert_eq!(
            g.get("nested"),
            Some(&Value::Array(vec![Value::Array(vec![
                Value::U8(7),
                Value::U8(8)
            ])]))
        );
        for (name, kind, dims, raw) in &tensors {
            let info = g.tensor(name).unwrap();
            assert_eq!(info.kind.id(), *kind, "{name}");
            assert_eq!(&info.dims, dims);
            assert_eq!(
                info.shape(),
                dims.iter().rev().map(|&d| d as usize).collect::<Vec<_>>()
            );
            assert!(info.offset.is_multiple_of(alignment as u64));
            if let TensorType::Other(_) = info.kind {
                let e = g.to_f32(name).unwrap_err().to_string();
                assert!(
                    e.contains(name) && e.contains("type 14") && e.contains("not supported"),
                    "{e}"
                );
                continue;
            }
            let (_, got) = g.bytes(name).unwrap();
            assert_eq!(got, &raw[..], "{name}: the bytes in place");
            let (shape, vals) = g.to_f32(name).unwrap();
            assert_eq!(shape, info.shape());
            let want: Vec<f32> = match kind {
                0 => raw
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                    .collect(),
                1 => raw
                    .chunks_exact(2)
                    .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
                    .collect(),
                30 => raw
                    .chunks_exact(2)
                    .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
                    .collect(),
                k => spec_dequant(*k, raw),
            };
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&vals), bits(&want), "{name}: dequantised bit for bit");
        }
    }
}

fn assert_format_error(r: Result<Gguf, Error>, path: &std::path::Path) {
    match r {
        Err(Error::Format { path: p, .. }) if p == path => {}
        Err(e) => panic!("{}: expected a format error, got {e}", path.display()),
        Ok(_) => panic!("{}: opened a corrupt file", path.display()),
    }
}

#[test]
fn gguf_refuses_truncated_and_corrupt_files() {
    let (bytes, _) = full_file(32);
    // Every truncation is an error, never a panic.
    for cut in (0..bytes.len()).step_by(7) {
        let path = temp("cut.gguf", &bytes[..cut]);
        assert_format_error(Gguf::open(&path), &path);
    }
    let check = |name: &str, b: &[u8], needle: &str| {
        let path = temp(name, b);
        let e = Gguf::open(&path).unwrap_err().to_string();
        assert!(
            e.contains(&*path.display().to_string()) && e.contains(needle),
            "{name}: {e}"
        );
    };
    let mut bad = bytes.clone();
    bad[0] = b'X';
    check("magic.gguf", &bad, "not a GGUF file");
    let mut bad = bytes.clone();
    bad[4] = 9;
    check("version.gguf", &bad, "version 9");
    // A string claiming more bytes than the file has (the first key's length).
    let mut bad = bytes.clone();
    bad[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
    check("string.gguf", &bad, "truncated");
    // An array claiming 2^40 elements must not reserve memory for them.
    let mut w = Writer::new(32);
    let mut a = 0u32.to_le_bytes().to_vec();
    a.extend((1u64 << 40).to_le_bytes());
    w.kv_raw("huge", 9, &a);
    check(
        "array.gguf",
        &w.bytes(),
        "huge: array of 1099511627776 elements",
    );
    // A tensor whose data runs past the end of the file.
    let mut w = Writer::new(32);
    w.tensor("big", &[1024, 1024], 0, &[0; 64]);
    check(
        "extent.gguf",
        &w.bytes(),
        "big: F32 [1024, 1024] needs bytes",
    );
    // A quantised tensor whose rows are not whole blocks.
    let mut w = Writer::new(32);
    w.tensor("ragged", &[48], 8, &[0; 68]);
    check(
        "ragged.gguf",
        &w.bytes(),
        "ragged: innermost extent 48 is not a multiple",
    );
    // Two tensors of one name.
    let mut w = Writer::new(32);
    w.tensor("twice", &[1], 0, &[0; 4]);
    w.tensor("twice", &[1], 0, &[0; 4]);
    check("twice.gguf", &w.bytes(), "twice: the name appears twice");
    // A missing file is an I/O error naming it.
    let e = Gguf::open("/nonexistent/model.gguf").unwrap_err();
    assert!(
        matches!(e, Error::Io { .. }) && e.to_string().contains("/nonexistent/model.gguf"),
        "{e}"
    );
}

#[test]
fn safetensors_reads_floats_and_refuses_bad_files() {
    use safetensors::tensor::TensorView;
    use safetensors::Dtype;
    let f32s: Vec<u8> = (0..6)
        .flat_map(|i| (i as f32 - 1.0).to_le_bytes())
        .collect();
    let f16s: Vec<u8> = (0..4)
        .flat_map(|i| f16::from_f32(i as f32 * 0.5).to_le_bytes())
        .collect();
    let bf16s: Vec<u8> = (0..2)
        .flat_map(|i| bf16::from_f32(i as f32 + 7.0).to_le_bytes())
        .collect();
    let views = vec![
        ("a", TensorView::new(Dtype::F32, vec![2, 3], &f32s).unwrap()),
        ("b", TensorView::new(Dtype::F16, vec![4], &f16s).unwrap()),
        (
            "c",
            TensorView::new(Dtype::BF16, vec![1, 2], &bf16s).unwrap(),
        ),
        (
            "d",
            TensorView::new(Dtype::I64, vec![1], &[0u8; 8]).unwrap(),
        ),
    ];
    let bytes = safetensors::serialize(views, None).unwrap();
    let path = temp("t.safetensors", &bytes);
    let f = SafetensorsFile::open(&path).unwrap();
    assert_eq!(
        f.to_f32("a").unwrap(),
        (vec![2, 3], vec![-1.0, 0.0, 1.0, 2.0, 3.0, 4.0])
    );
    assert_eq!(f.to_f32("b").unwrap(), (vec![4], vec![0.0, 0.5, 1.0, 1.5]));
    assert_eq!(f.to_f32("c").unwrap(), (vec![1, 2], vec![7.0, 8.0]));
    let e = f.to_f32("d").unwrap_err().to_string();
    assert!(e.contains("d: dtype I64 is not supported"), "{e}");
    let e = f.to_f32("zz").unwrap_err().to_string();
    assert!(e.contains("zz: no such tensor"), "{e}");
    for cut in [0, 5, 20, bytes.len() - 1] {
        let p = temp("cut.safetensors", &bytes[..cut]);
        let e = SafetensorsFile::open(&p).unwrap_err();
        assert!(
            matches!(e, Error::Format { .. })
                && e.to_string().contains("not a valid safetensors file"),
            "{e}"
        );
    }
}
