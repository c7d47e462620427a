//! Fuzzing of the `.npy` reader: arbitrary bytes, valid files with random bytes flipped,
//! cut or appended, and files whose header is rebuilt from random pieces (wrong dicts,
//! keys, dtypes, shapes, fortran flags, versions, header lengths, nesting) over payloads
//! of about the right size. Every case is written under `CARGO_TARGET_TMPDIR` and read
//! with `ndfuse::npy::read_npy`. Property: an `Err` or an array whose length is its
//! shape's product (and, for an unmutated file, the values written), within the case's
//! time budget; never a panic, hang or abort. `NDFUSE_FUZZ_CASES` raises the counts.

mod fuzz_support;

use fuzz_support::{check, config};
use ndfuse::npy::{read_npy, write_npy};
use ndfuse::{Array, Context};
use proptest::prelude::*;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

const BUDGET: Duration = Duration::from_secs(20);

/// A fresh file name in this suite's scratch folder.
fn scratch_file() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = DIR.get_or_init(|| {
        let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fuzz_npy");
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("scratch folder");
        d
    });
    dir.join(format!(
        "case{}.npy",
        N.fetch_add(1, Ordering::Relaxed) % 64
    ))
}

/// Writes `bytes` to a scratch file and reads it back: Ok(len, shape product) or the
/// error's text. A panic or hang is the harness's business.
fn read_bytes(bytes: &[u8]) -> Result<(usize, usize), String> {
    let path = scratch_file();
    std::fs::write(&path, bytes).expect("scratch write");
    let r = read_npy(&path).map_err(|e| e.to_string());
    let _ = std::fs::remove_file(&path);
    let a = r?;
    Ok((a.len(), a.shape().iter().product()))
}

fn assert_consistent(r: &Result<(usize, usize), String>) {
    if let Ok((len, product)) = r {
        assert_eq!(len, product, "an array's length is its shape's product");
    }
}

/// Valid files of every dtype ndfuse writes, of a few shapes (0-d and empty included).
fn valid_files() -> &'static Vec<(Vec<u8>, Array)> {
    static FILES: OnceLock<Vec<(Vec<u8>, Array)>> = OnceLock::new();
    FILES.get_or_init(|| {
        let ctx = Context::new();
        let mut out = Vec::new();
        for shape in [&[][..], &[0], &[5], &[2, 3], &[2, 1, 3]] {
            let n: usize = shape.iter().product();
            let arrays: Vec<Array> = vec![
                ctx.from_vec((0..n).map(|i| i as f32 - 1.5).collect(), shape),
                ctx.from_vec((0..n).map(|i| i as f64 * 0.25).collect(), shape),
                ctx.from_vec((0..n).map(|i| i as i32 - 2).collect(), shape),
                ctx.from_vec((0..n).map(|i| i as i64 * 7).collect(), shape),
                ctx.from_vec((0..n).map(|i| i % 2 == 0).collect::<Vec<bool>>(), shape),
                ctx.from_vec(
                    (0..n)
                        .map(|i| ndfuse::f16::from_f64(i as f64))
                        .collect::<Vec<_>>(),
                    shape,
                ),
            ]
            .into_iter()
            .map(|t| t.and_then(|t| t.eval()).expect("a valid array"))
            .collect();
            for a in arrays {
                let path = scratch_file();
                write_npy(&path, &a).expect("write a valid file");
                out.push((std::fs::read(&path).expect("read it back"), a));
            }
        }
        out
    })
}

#[derive(Clone, Debug)]
enum Mutation {
    Flip { at: usize, bits: u8 },
    Cut { at: usize },
    Append(Vec<u8>),
    Overwrite { at: usize, bytes: Vec<u8> },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 1u8..=255).prop_map(|(at, bits)| Mutation::Flip { at, bits }),
        any::<usize>().prop_map(|at| Mutation::Cut { at }),
        prop::collection::vec(any::<u8>(), 1..16).prop_map(Mutation::Append),
        (any::<usize>(), prop::collection::vec(any::<u8>(), 1..8))
            .prop_map(|(at, bytes)| Mutation::Overwrite { at, bytes }),
    ]
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    match m {
        Mutation::Flip { at, bits } if !bytes.is_empty() => {
            let i = at % bytes.len();
            bytes[i] ^= bits;
        }
        Mutation::Cut { at } => bytes.truncate(at % (bytes.len() + 1)),
        Mutation::Append(b) => bytes.extend_from_slice(b),
        Mutation::Overwrite { at, bytes: b } if !bytes.is_empty() => {
            let i = at % bytes.len();
            for (k, &v) in b.iter().enumerate() {
                if let Some(slot) = bytes.get_mut(i + k) {
                    *slot = v;
                }
            }
        }
        _ => {}
    }
}

/// A header dict from random pieces: each key present, missing, doubled or misspelt,
/// each value right, wrong in type, huge or nested.
fn header_text() -> impl Strategy<Value = String> {
    let descr = prop::sample::select(vec![
        "'<f4'",
        "'<f8'",
        "'<f2'",
        "'|b1'",
        "'<i4'",
        "'<i8'",
        "'>f8'",
        "'>i4'",
        "'=f4'",
        "'f4'",
        "'?'",
        "'<u1'",
        "'|O'",
        "'<c8'",
        "'<V3'",
        "'<M8[s]'",
        "''",
        "'<'",
        "'<f4",
        "[('a', '<f4')]",
        "4",
        "None",
        "'\u{e9}'",
    ]);
    let fortran = prop::sample::select(vec!["False", "True", "0", "None", "'False'", "Tru", ""]);
    let dim = prop::sample::select(vec![
        "0",
        "1",
        "2",
        "3",
        "5",
        "7",
        "-1",
        "18446744073709551615",
        "18446744073709551616",
        "4294967296",
        "9223372036854775807",
        "3L",
        "2.0",
        "'3'",
        "()",
        "[2]",
    ]);
    let shape = prop::collection::vec(dim, 0..5).prop_map(|d| match d.len() {
        1 => format!("({},)", d[0]),
        _ => format!("({})", d.join(", ")),
    });
    let key = |k: &'static str| {
        prop::sample::select(vec![
            format!("'{k}'"),
            format!("\"{k}\""),
            format!("'{k}x'"),
            String::new(),
        ])
    };
    (
        key("descr"),
        descr,
        key("fortran_order"),
        fortran,
        key("shape"),
        shape,
        prop::sample::select(vec!["", ", ", ",", " }", "{", "'extra': 1, ", "(", "]"]),
        prop::collection::vec(0usize..3, 3),
    )
        .prop_map(|(kd, d, kf, f, ks, s, tail, order)| {
            let entries = [(kd, d.to_string()), (kf, f.to_string()), (ks, s)];
            let mut parts = Vec::new();
            for &i in &order {
                let (k, v) = &entries[i];
                if !k.is_empty() {
                    parts.push(format!("{k}: {v}"));
                }
            }
            format!("{{{}{tail}}}", parts.join(", "))
        })
}

/// A file around `header`: version, header length (true, or off by a little or a lot),
/// padding to 64 and a payload of `payload` bytes.
fn frame(header: &str, version: u8, len_delta: i64, payload: usize) -> Vec<u8> {
    let mut h = header.as_bytes().to_vec();
    let pre = if version == 1 { 10 } else { 12 };
    while !(pre + h.len() + 1).is_multiple_of(64) {
        h.push(b' ');
    }
    h.push(b'\n');
    let len = (h.len() as i64 + len_delta).max(0) as u64;
    let mut out = b"\x93NUMPY".to_vec();
    out.push(version);
    out.push(0);
    if version == 1 {
        out.extend_from_slice(&(len as u16).to_le_bytes());
    } else {
        out.extend_from_slice(&(len as u32).to_le_bytes());
    }
    out.extend_from_slice(&h);
    out.extend((0..payload).map(|i| (i * 37 % 251) as u8));
    out
}

proptest! {
    #![proptest_config(config(1000))]

    #[test]
    fn arbitrary_bytes_never_crash(
        body in prop::collection::vec(any::<u8>(), 0..200),
        magic in any::<bool>(),
        version in 0u8..5,
    ) {
        let mut bytes = Vec::new();
        if magic {
            bytes.extend_from_slice(b"\x93NUMPY");
            bytes.push(version);
            bytes.push(0);
        }
        bytes.extend_from_slice(&body);
        let r = check(&bytes, BUDGET, {
            let b = bytes.clone();
            move || read_bytes(&b)
        })?;
        assert_consistent(&r);
    }

    #[test]
    fn mutated_valid_files_never_crash(
        which in any::<prop::sample::Index>(),
        muts in prop::collection::vec(mutation(), 0..4),
    ) {
        let (valid, array) = which.get(valid_files());
        let mut bytes = valid.clone();
        for m in &muts {
            apply(&mut bytes, m);
        }
        let unchanged = bytes == *valid;
        let expect = array.to_f64_vec();
        let input = (muts, bytes.len());
        let r = check(&input, BUDGET, {
            let b = bytes.clone();
            move || {
                let path = scratch_file();
                std::fs::write(&path, &b).expect("scratch write");
                let r = read_npy(&path).map(|a| a.to_f64_vec()).map_err(|e| e.to_string());
                let _ = std::fs::remove_file(&path);
                r
            }
        })?;
        if unchanged {
            let got = r.map_err(TestCaseError::fail)?;
            prop_assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                expect.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn rebuilt_headers_never_crash(
        header in header_text(),
        version in prop::sample::select(vec![1u8, 2, 3]),
        len_delta in prop_oneof![Just(0i64), -3i64..3, Just(1 << 20), Just(-(1 << 20))],
        payload in prop_oneof![0usize..64, Just(24), Just(48), Just(6)],
    ) {
        let bytes = frame(&header, version, len_delta, payload);
        let input = (header, version, len_delta, payload);
        let r = check(&input, BUDGET, move || read_bytes(&bytes))?;
        assert_consistent(&r);
    }

    #[test]
    fn deeply_nested_headers_never_crash(
        open in prop::sample::select(vec!["[", "(", "{'a': ", "{'descr': ["]),
        depth in prop_oneof![0usize..50, Just(5_000), Just(20_000), Just(60_000)],
        version in prop::sample::select(vec![1u8, 2]),
    ) {
        // One header of up to 64 KiB nested as deep as it fits.
        let header = format!("{{'shape': {}", open.repeat(depth));
        let bytes = frame(&header, version, 0, 0);
        let input = (open, depth, version);
        let r = check(&input, BUDGET, move || read_bytes(&bytes))?;
        assert_consistent(&r);
    }
}

/// A directory, a missing file and an empty file are errors.
#[test]
fn paths_that_are_not_files_are_errors() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    assert!(read_npy(&dir).is_err());
    assert!(read_npy(dir.join("fuzz_npy_no_such_file.npy")).is_err());
    assert!(read_bytes(&[]).is_err());
}

/// Regression (found by `deeply_nested_headers_never_crash`): a v1 header of 60,000
/// `[` overflowed the stack of the recursive header parser (SIGABRT); now refused.
#[test]
fn npy_header_nested_60000_deep_is_an_error_not_a_stack_overflow() {
    let bytes = frame(&format!("{{'shape': {}", "[".repeat(60_000)), 1, 0, 0);
    let why = check_plain(&bytes).expect_err("refused");
    assert!(why.contains("nested deeper than 32 levels"), "{why}");
}

/// Regression: the same on a 2 MiB thread with a v2 header of 1,000,000 `(`.
#[test]
fn npy_v2_header_nested_a_million_deep_is_an_error() {
    let bytes = frame(&format!("{{'descr': {}", "(".repeat(1_000_000)), 2, 0, 0);
    let why = check_plain(&bytes).expect_err("refused");
    assert!(why.contains("nested deeper than 32 levels"), "{why}");
}

fn check_plain(bytes: &[u8]) -> Result<(usize, usize), String> {
    let b = bytes.to_vec();
    fuzz_support::run_case("(a nested header)", BUDGET, move || read_bytes(&b))
        .unwrap_or_else(|crash| panic!("{crash}"))
}
