//! IDX files and Fashion-MNIST: round trips of every element type, plain and gzip'd;
//! each kind of malformed file an `Error::Data` naming the file and the fault; the data
//! set from synthetic files; and the real Fashion-MNIST from Debian's
//! `dataset-fashion-mnist` where it is installed (required with `NDFUSE_REQUIRE_DATA=1`,
//! as CI sets; skipped with a printed reason elsewhere).

use flate2::write::GzEncoder;
use flate2::Compression;
use ndfuse::DType;
use ndfuse_nn::{parse_idx, read_idx, Error, FashionMnist, IdxValues};
use std::io::Write;
use std::path::{Path, PathBuf};

mod support;

/// A fresh directory under the system's temporary one.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ndfuse-idx-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir
}

/// An IDX file's bytes: magic, big-endian extents, then `data` (already big-endian).
fn idx_bytes(code: u8, dims: &[u32], data: &[u8]) -> Vec<u8> {
    let mut b = vec![0, 0, code, dims.len() as u8];
    for d in dims {
        b.extend_from_slice(&d.to_be_bytes());
    }
    b.extend_from_slice(data);
    b
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = GzEncoder::new(Vec::new(), Compression::fast());
    e.write_all(bytes).expect("gzip in memory");
    e.finish().expect("gzip in memory")
}

fn write(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).expect("a scratch file");
}

#[test]
fn every_element_type_reads_back_plain_and_gzipped() {
    let dir = scratch("types");
    let u8s: Vec<u8> = (0..24).map(|i| (i * 11) as u8).collect();
    let i16s: Vec<i16> = vec![-300, 7, 32767, -32768, 0, 1];
    let i32s: Vec<i32> = vec![-70000, 1 << 30, 5, -1];
    let f32s: Vec<f32> = vec![1.5, -0.25, 3.0e-8, f32::MAX];
    let f64s: Vec<f64> = vec![std::f64::consts::PI, -1e300];
    let be = |v: &[i16]| v.iter().flat_map(|x| x.to_be_bytes()).collect::<Vec<u8>>();
    let cases: Vec<(u8, Vec<u32>, Vec<u8>, IdxValues)> = vec![
        (0x08, vec![2, 3, 4], u8s.clone(), IdxValues::U8(u8s.clone())),
        (
            0x09,
            vec![4],
            vec![0x80, 0x7f, 0xff, 1],
            IdxValues::I8(vec![-128, 127, -1, 1]),
        ),
        (0x0B, vec![2, 3], be(&i16s), IdxValues::I16(i16s.clone())),
        (
            0x0C,
            vec![4],
            i32s.iter().flat_map(|x| x.to_be_bytes()).collect(),
            IdxValues::I32(i32s.clone()),
        ),
        (
            0x0D,
            vec![2, 2],
            f32s.iter().flat_map(|x| x.to_be_bytes()).collect(),
            IdxValues::F32(f32s.clone()),
        ),
        (
            0x0E,
            vec![2],
            f64s.iter().flat_map(|x| x.to_be_bytes()).collect(),
            IdxValues::F64(f64s.clone()),
        ),
    ];
    for (code, dims, data, want) in cases {
        let bytes = idx_bytes(code, &dims, &data);
        for (suffix, file) in [("plain", bytes.clone()), ("gz", gzip(&bytes))] {
            let path = dir.join(format!("t{code:02x}.{suffix}"));
            write(&path, &file);
            let got = read_idx(&path).unwrap_or_else(|e| panic!("type 0x{code:02x}: {e}"));
            let dims: Vec<usize> = dims.iter().map(|&d| d as usize).collect();
            assert_eq!(got.dims, dims, "type 0x{code:02x} {suffix}");
            assert_eq!(got.values, want, "type 0x{code:02x} {suffix}");
            let a = got.to_array().expect("an array");
            assert_eq!(a.shape(), &dims[..]);
            let dtype = match code {
                0x0D => DType::F32,
                0x0E => DType::F64,
                _ => DType::I32,
            };
            assert_eq!(a.dtype(), dtype, "type 0x{code:02x}");
        }
    }
    // u8 widens to i32 value for value.
    let a = parse_idx(&idx_bytes(0x08, &[3], &[0, 200, 255]))
        .expect("an IDX")
        .to_array()
        .expect("an array");
    assert_eq!(a.to_f64_vec(), vec![0.0, 200.0, 255.0]);
}

/// The message of an `Error::Data` for `path`, or a panic saying what came instead.
fn data_error(r: ndfuse_nn::Result<impl std::fmt::Debug>, path: &Path) -> String {
    match r {
        Err(e @ Error::Data { .. }) => {
            let Error::Data { path: p, .. } = &e else {
                unreachable!()
            };
            assert_eq!(p, path, "the error names the file");
            e.to_string()
        }
        other => panic!("expected Error::Data for {}, got {other:?}", path.display()),
    }
}

#[test]
fn malformed_files_are_errors_that_name_the_file_and_the_fault() {
    let dir = scratch("bad");
    let good = idx_bytes(0x08, &[2, 3], &[1, 2, 3, 4, 5, 6]);
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("short", vec![0, 0], "shorter than the 4"),
        ("magic", vec![1, 2, 8, 1, 0, 0, 0, 0], "magic number"),
        ("code", idx_bytes(0x07, &[1], &[0]), "type code 0x07"),
        (
            "header",
            vec![0, 0, 8, 3, 0, 0, 0, 2],
            "header of rank 3 needs 16 bytes",
        ),
        (
            "data_short",
            good[..good.len() - 1].to_vec(),
            "need 6 bytes of data, the file has 5",
        ),
        (
            "data_long",
            [good.clone(), vec![9]].concat(),
            "the file has 7",
        ),
        ("gzip", vec![0x1f, 0x8b, 8, 0, 1, 2, 3], "gzip"),
        (
            "huge",
            idx_bytes(0x0E, &[u32::MAX, u32::MAX, u32::MAX], &[]),
            "overflow",
        ),
    ];
    for (name, bytes, says) in cases {
        let path = dir.join(name);
        write(&path, &bytes);
        let msg = data_error(read_idx(&path), &path);
        assert!(msg.contains(says), "{name}: {msg:?} should say {says:?}");
        assert!(msg.contains(&*path.to_string_lossy()), "{name}: {msg}");
    }
    // A file that is not there is an I/O error naming it.
    let missing = dir.join("absent.idx");
    let err = read_idx(&missing).expect_err("a missing file");
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
    assert!(err.to_string().contains("absent.idx"), "{err}");
}

/// Fashion-MNIST's four files in `dir`: `n` training and `m` test images of 28 x 28
/// (pixel `i` of image `j` is `(i + 7 j) % 256`), labels `j % 10` unless `labels` says.
fn synthetic(dir: &Path, (n, m): (usize, usize), labels: Option<Vec<u8>>) {
    let images = |count: usize| {
        let px: Vec<u8> = (0..count)
            .flat_map(|j| (0..784).map(move |i| ((i + 7 * j) % 256) as u8))
            .collect();
        gzip(&idx_bytes(0x08, &[count as u32, 28, 28], &px))
    };
    let label_file = |count: usize, given: Option<Vec<u8>>| {
        let l = given.unwrap_or_else(|| (0..count).map(|j| (j % 10) as u8).collect());
        gzip(&idx_bytes(0x08, &[l.len() as u32], &l))
    };
    let [tx, ty, vx, vy] = FashionMnist::FILES.map(|f| dir.join(f));
    write(&tx, &images(n));
    write(&ty, &label_file(n, labels));
    write(&vx, &images(m));
    write(&vy, &label_file(m, None));
}

#[test]
fn fashion_mnist_reads_its_four_files_as_nchw_images_over_255() {
    let dir = scratch("fashion");
    synthetic(&dir, (12, 5), None);
    assert!(FashionMnist::present(&dir));
    let data = FashionMnist::load(&dir).expect("the synthetic data set");
    assert_eq!(data.train.len(), 12);
    assert_eq!(data.test.len(), 5);
    assert_eq!(data.train.features().shape(), &[12, 1, 28, 28]);
    assert_eq!(data.train.features().dtype(), DType::F32);
    assert_eq!(data.train.labels().dtype(), DType::I64);
    let x = data.train.features().to_f64_vec();
    for (j, i) in [(0usize, 0usize), (3, 100), (11, 783)] {
        let want = ((i + 7 * j) % 256) as f32 / 255.0;
        assert_eq!(x[j * 784 + i], f64::from(want), "image {j} pixel {i}");
    }
    let y = data.test.labels().to_f64_vec();
    assert_eq!(y, vec![0.0, 1.0, 2.0, 3.0, 4.0]);
}

#[test]
fn fashion_mnist_refuses_missing_and_inconsistent_files() {
    // Missing: the message says which package provides the data.
    let empty = scratch("empty");
    let err = FashionMnist::load(&empty).expect_err("no files");
    let msg = err.to_string();
    assert!(
        msg.contains("dataset-fashion-mnist") && msg.contains("train-images-idx3-ubyte.gz"),
        "{msg}"
    );
    // Fewer labels than images.
    let dir = scratch("fewer");
    synthetic(&dir, (6, 2), Some(vec![1, 2, 3]));
    let path = dir.join(FashionMnist::FILES[1]);
    let msg = data_error(FashionMnist::load(&dir), &path);
    assert!(msg.contains("3 labels for the 6 images"), "{msg}");
    // A label outside the ten classes.
    let dir = scratch("class");
    synthetic(&dir, (3, 2), Some(vec![1, 10, 3]));
    let msg = data_error(FashionMnist::load(&dir), &dir.join(FashionMnist::FILES[1]));
    assert!(msg.contains("label 10 at position 1"), "{msg}");
    // Images of another size.
    let dir = scratch("size");
    synthetic(&dir, (2, 2), None);
    let small = dir.join(FashionMnist::FILES[0]);
    write(&small, &gzip(&idx_bytes(0x08, &[2, 4, 4], &[0; 32])));
    let msg = data_error(FashionMnist::load(&dir), &small);
    assert!(msg.contains("[N, 28, 28], found u8 of [2, 4, 4]"), "{msg}");
}

/// The real data set: 60,000 + 10,000 images, 6,000 + 1,000 of each class, the first
/// training image an ankle boot (label 9), the training pixels' mean 0.2860 (the figure
/// every Fashion-MNIST normalisation uses).
#[test]
fn the_real_fashion_mnist_from_debian() {
    let Some(data) = support::fashion_mnist() else {
        return;
    };
    assert_eq!(data.train.features().shape(), &[60000, 1, 28, 28]);
    assert_eq!(data.test.features().shape(), &[10000, 1, 28, 28]);
    for (split, per_class) in [(&data.train, 6000), (&data.test, 1000)] {
        let mut counts = [0usize; 10];
        for l in split.labels().to_f64_vec() {
            counts[l as usize] += 1;
        }
        assert_eq!(counts, [per_class; 10]);
    }
    assert_eq!(data.train.labels().to_f64_vec()[0], 9.0, "an ankle boot");
    let x = data.train.features().to_f64_vec();
    let mean = x.iter().sum::<f64>() / x.len() as f64;
    assert!((mean - 0.2860).abs() < 5e-4, "training pixel mean {mean}");
    assert!(x.iter().all(|&p| (0.0..=1.0).contains(&p)));
}
