//! Checkpoints: bit-exact round trips of every dtype, metadata, the safetensors layout,
//! truncated and corrupt files, atomic replacement, and shape-mismatch messages.

use ndfuse::{bf16, f16, Array, DType};
use ndfuse_nn::{load_checkpoint, save_checkpoint, Error};
use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;

/// A fresh directory for one test.
fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ndfuse-nn-ckpt-{tag}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

fn meta() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("step".to_string(), "1200".to_string()),
        ("optimizer".to_string(), "adamw".to_string()),
        ("note".to_string(), "ünïcødé, \"quotes\"\n".to_string()),
    ])
}

/// One tensor of every dtype, with awkward bit patterns: NaN payloads, signed zeros,
/// infinities, subnormals, extremes.
fn every_dtype() -> Vec<(&'static str, Array)> {
    let f32_bits = [
        0x7fc0_0001u32, // quiet NaN with a payload
        0xffa0_0005,    // negative signalling NaN with a payload
        0x8000_0000,    // -0.0
        0x7f80_0000,    // +inf
        0x0000_0001,    // smallest subnormal
        0x3f80_0000,    // 1.0
    ];
    let f16_bits = [0x7e01u16, 0xfc00, 0x8000, 0x0001, 0x3c00, 0x7bff];
    let bf16_bits = [0x7fc1u16, 0xff80, 0x8000, 0x0001, 0x3f80, 0x7f7f];
    vec![
        (
            "f32",
            Array::from_vec(f32_bits.map(f32::from_bits).to_vec(), &[2, 3]).unwrap(),
        ),
        (
            "f64",
            Array::from_vec(
                vec![
                    f64::from_bits(0x7ff8_0000_dead_beef),
                    -0.0,
                    f64::MIN_POSITIVE,
                    1e300,
                ],
                &[4],
            )
            .unwrap(),
        ),
        (
            "f16",
            Array::from_vec(f16_bits.map(f16::from_bits).to_vec(), &[3, 2]).unwrap(),
        ),
        (
            "bf16",
            Array::from_vec(bf16_bits.map(bf16::from_bits).to_vec(), &[6]).unwrap(),
        ),
        (
            "i32",
            Array::from_vec(vec![i32::MIN, -1, 0, i32::MAX], &[2, 2]).unwrap(),
        ),
        (
            "i64",
            Array::from_vec(vec![i64::MIN, -1, 0, i64::MAX, 42], &[5, 1]).unwrap(),
        ),
        (
            "bool",
            Array::from_vec(vec![true, false, false, true], &[4]).unwrap(),
        ),
        ("scalar", Array::from_vec(vec![2.5f32], &[]).unwrap()),
        (
            "empty",
            Array::from_vec(Vec::<f32>::new(), &[0, 3]).unwrap(),
        ),
    ]
}

/// The raw bits of every element, as u64, whatever the dtype (compared instead of the
/// values, so NaNs compare by payload).
fn bits(a: &Array) -> Vec<u64> {
    match a.dtype() {
        DType::F32 => a
            .as_slice::<f32>()
            .unwrap()
            .iter()
            .map(|x| u64::from(x.to_bits()))
            .collect(),
        DType::F64 => a
            .as_slice::<f64>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect(),
        DType::F16 => a
            .as_slice::<f16>()
            .unwrap()
            .iter()
            .map(|x| u64::from(x.to_bits()))
            .collect(),
        DType::BF16 => a
            .as_slice::<bf16>()
            .unwrap()
            .iter()
            .map(|x| u64::from(x.to_bits()))
            .collect(),
        DType::I32 => a
            .as_slice::<i32>()
            .unwrap()
            .iter()
            .map(|&x| x as u32 as u64)
            .collect(),
        DType::I64 => a
            .as_slice::<i64>()
            .unwrap()
            .iter()
            .map(|&x| x as u64)
            .collect(),
        DType::Bool => a
            .as_slice::<bool>()
            .unwrap()
            .iter()
            .map(|&x| u64::from(x))
            .collect(),
    }
}

fn save_every_dtype(path: &std::path::Path) -> Vec<(&'static str, Array)> {
    let tensors = every_dtype();
    let refs: Vec<(&str, &Array)> = tensors.iter().map(|(n, a)| (*n, a)).collect();
    save_checkpoint(path, &refs, &meta()).unwrap();
    tensors
}

#[test]
fn every_dtype_round_trips_bit_for_bit_with_metadata() {
    let dir = scratch("roundtrip");
    let path = dir.join("model.safetensors");
    let tensors = save_every_dtype(&path);
    let ckpt = load_checkpoint(&path).unwrap();
    assert_eq!(ckpt.tensors.len(), tensors.len());
    for (name, want) in &tensors {
        let got = ckpt.get(name).unwrap();
        assert_eq!(got.dtype(), want.dtype(), "{name}");
        assert_eq!(got.shape(), want.shape(), "{name}");
        assert_eq!(bits(got), bits(want), "{name}");
    }
    assert_eq!(ckpt.metadata(), &meta());
    assert_eq!(ckpt.path(), path);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_file_is_plain_safetensors() {
    // Read back by hand against the format's definition, not through the crate: a
    // little-endian u64 header length, a JSON header, then the raw little-endian data.
    let dir = scratch("layout");
    let path = dir.join("w.safetensors");
    let w = Array::from_vec(vec![1.0f32, -2.0], &[2]).unwrap();
    save_checkpoint(&path, &[("w", &w)], &BTreeMap::new()).unwrap();
    let bytes = fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&bytes[8..8 + n]).unwrap();
    assert!(
        header.contains(r#""w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}"#),
        "{header}"
    );
    let data = &bytes[8 + n..];
    assert_eq!(data, [0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0]);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn truncated_files_are_errors_naming_the_file() {
    let dir = scratch("truncated");
    let path = dir.join("model.safetensors");
    save_every_dtype(&path);
    let whole = fs::read(&path).unwrap();
    let cut_path = dir.join("cut.safetensors");
    let n = u64::from_le_bytes(whole[..8].try_into().unwrap()) as usize;
    for len in [0, 1, 7, 8, 9, 8 + n / 2, 8 + n, 8 + n + 1, whole.len() - 1] {
        fs::write(&cut_path, &whole[..len]).unwrap();
        let err = load_checkpoint(&cut_path).unwrap_err();
        assert!(
            matches!(err, Error::Checkpoint { .. }),
            "cut at {len}: {err}"
        );
        assert!(
            err.to_string().contains("cut.safetensors"),
            "cut at {len}: {err}"
        );
    }
    // Trailing bytes are as wrong as missing ones.
    let mut long = whole.clone();
    long.push(0);
    fs::write(&cut_path, &long).unwrap();
    assert!(load_checkpoint(&cut_path).is_err());
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn every_flipped_header_byte_is_an_error_not_a_panic() {
    let dir = scratch("flipped");
    let path = dir.join("model.safetensors");
    save_every_dtype(&path);
    let whole = fs::read(&path).unwrap();
    let n = u64::from_le_bytes(whole[..8].try_into().unwrap()) as usize;
    let bad = dir.join("bad.safetensors");
    // Every byte of the length and the JSON: flipping all its bits makes a non-ASCII
    // byte in the JSON (invalid UTF-8) or a length that does not fit the file.
    for at in 0..8 + n {
        let mut bytes = whole.clone();
        bytes[at] ^= 0xff;
        fs::write(&bad, &bytes).unwrap();
        let err = load_checkpoint(&bad).unwrap_err().to_string();
        assert!(err.contains("bad.safetensors"), "byte {at}: {err}");
    }
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_bad_bool_byte_names_the_tensor() {
    let dir = scratch("bool");
    let path = dir.join("mask.safetensors");
    let mask = Array::from_vec(vec![true, false, true], &[3]).unwrap();
    save_checkpoint(&path, &[("mask", &mask)], &BTreeMap::new()).unwrap();
    let mut bytes = fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] = 7;
    fs::write(&path, &bytes).unwrap();
    let err = load_checkpoint(&path).unwrap_err();
    match &err {
        Error::Checkpoint { tensor, .. } => assert_eq!(tensor.as_deref(), Some("mask")),
        other => panic!("{other}"),
    }
    let text = err.to_string();
    assert!(
        text.contains("mask.safetensors") && text.contains("\"mask\""),
        "{text}"
    );
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_failed_save_leaves_the_previous_file_intact() {
    let dir = scratch("atomic");
    let path = dir.join("model.safetensors");
    let old = Array::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
    save_checkpoint(&path, &[("w", &old)], &meta()).unwrap();
    let before = fs::read(&path).unwrap();
    // A repeated name is refused before anything is written.
    let new = Array::from_vec(vec![3.0f32], &[1]).unwrap();
    let err = save_checkpoint(&path, &[("w", &new), ("w", &new)], &meta()).unwrap_err();
    assert!(err.to_string().contains("model.safetensors"), "{err}");
    assert_eq!(fs::read(&path).unwrap(), before);
    // A target that cannot be replaced (a directory in its place) fails cleanly and
    // leaves no temporary file beside it.
    let blocked = dir.join("blocked.safetensors");
    fs::create_dir(&blocked).unwrap();
    let err = save_checkpoint(&blocked, &[("w", &new)], &meta()).unwrap_err();
    assert!(err.to_string().contains("blocked.safetensors"), "{err}");
    let names: Vec<String> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.ends_with(".tmp")), "{names:?}");
    // A missing directory is an error naming the file.
    let err = save_checkpoint(
        &dir.join("no/such/dir/m.safetensors"),
        &[("w", &new)],
        &meta(),
    );
    assert!(err.unwrap_err().to_string().contains("m.safetensors"));
    // And a good save replaces the file whole.
    save_checkpoint(&path, &[("w", &new)], &meta()).unwrap();
    assert_eq!(load_checkpoint(&path).unwrap().get("w").unwrap(), &new);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn missing_tensors_and_shape_mismatches_name_file_tensor_and_shapes() {
    let dir = scratch("mismatch");
    let path = dir.join("model.safetensors");
    let w = Array::from_vec(vec![0.5f32; 12], &[3, 4]).unwrap();
    save_checkpoint(&path, &[("layer0.weight", &w)], &BTreeMap::new()).unwrap();
    let mut ckpt = load_checkpoint(&path).unwrap();

    let err = ckpt.get("layer1.weight").unwrap_err().to_string();
    assert!(
        err.contains("model.safetensors") && err.contains("layer1.weight"),
        "{err}"
    );

    let err = ckpt
        .expect_shape("layer0.weight", &[4, 3], DType::F32)
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::ShapeMismatch { .. }));
    for part in ["model.safetensors", "layer0.weight", "[3, 4]", "[4, 3]"] {
        assert!(text.contains(part), "{part} missing from: {text}");
    }
    let text = ckpt
        .expect_shape("layer0.weight", &[3, 4], DType::F16)
        .unwrap_err()
        .to_string();
    assert!(text.contains("f32") && text.contains("f16"), "{text}");
    assert_eq!(
        ckpt.expect_shape("layer0.weight", &[3, 4], DType::F32)
            .unwrap(),
        &w
    );

    assert_eq!(ckpt.take("layer0.weight").unwrap(), w);
    assert!(ckpt.take("layer0.weight").is_err(), "taken twice");
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_unreadable_path_is_an_io_error_naming_it() {
    let err =
        load_checkpoint(std::path::Path::new("/nonexistent/ndfuse/ckpt.safetensors")).unwrap_err();
    assert!(matches!(err, Error::Io { .. }));
    assert!(err.to_string().contains("ckpt.safetensors"), "{err}");
}
