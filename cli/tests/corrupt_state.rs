//! Corrupt state on disk (issue 18, item 6), through the binary so that no variable
//! leaks into another test: a directory, binary garbage, a truncated or non-UTF-8 file
//! as `NDFUSE_CONFIG`, and a `kernel_cache_dir` that is a file or holds garbage and
//! truncated images. Each run must end with exit 0 and the right value, or exit 1 and
//! one line on stderr naming the problem: never a signal, a panic or a wrong result.

use std::path::PathBuf;
use std::process::Command;

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn ndfuse(args: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> Run {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ndfuse"));
    c.args(args).env_remove("NDFUSE_CONFIG");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().expect("the ndfuse binary runs");
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("ndfuse-corrupt")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch folder");
    dir
}

/// Exit 1 (not a signal, not a panic's 101) with one stderr line containing `want`.
fn assert_clear_error(r: &Run, want: &str) {
    assert_eq!(r.code, Some(1), "stderr: {}", r.stderr);
    assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
    assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
    assert!(r.stderr.contains(want), "{want:?} not in {}", r.stderr);
}

const EVAL: [&str; 2] = ["eval", "2 * 3"];

#[test]
fn a_directory_as_ndfuse_config_is_a_clear_error() {
    let dir = scratch("config_dir");
    let r = ndfuse(&EVAL, &[("NDFUSE_CONFIG", dir.as_os_str())]);
    assert_clear_error(&r, "config_dir");
}

#[test]
fn binary_garbage_as_ndfuse_config_is_a_clear_error() {
    let dir = scratch("config_garbage");
    let cases: [(&str, Vec<u8>); 4] = [
        ("binary.toml", (0..=255u8).cycle().take(4096).collect()),
        ("latin1.toml", b"debug = \xe9\xff\n".to_vec()),
        ("nul.toml", b"debug = 1\0\0\0\n".to_vec()),
        (
            "truncated.toml",
            b"disable_passes = [\"cse\", \"dc".to_vec(),
        ),
    ];
    for (name, bytes) in cases {
        let path = dir.join(name);
        std::fs::write(&path, bytes).expect("write");
        let r = ndfuse(&EVAL, &[("NDFUSE_CONFIG", path.as_os_str())]);
        assert_clear_error(&r, name);
    }
}

#[test]
fn a_kernel_cache_dir_that_is_a_file_or_full_of_garbage_never_gives_a_wrong_result() {
    let dir = scratch("kernel_cache");
    let file = dir.join("a_file");
    std::fs::write(&file, b"not a directory").expect("write");
    let garbage = dir.join("garbage");
    std::fs::create_dir_all(&garbage).expect("dir");
    // Names shaped like the cache's (kernel-hash-nvrtcX.Y-arch.{cu,cubin,ptx}) with
    // garbage, truncated and empty contents.
    for (name, bytes) in [
        (
            "k0_mul_sum-0000000000000000-nvrtc12.9-sm_90.cu",
            &b"__global__ void"[..],
        ),
        (
            "k0_mul_sum-0000000000000000-nvrtc12.9-sm_90.cubin",
            &b"\x7fELF\x02\x01"[..],
        ),
        (
            "k0_mul_sum-0000000000000000-nvrtc12.9-compute_90.ptx",
            &b""[..],
        ),
        (".k0.cubin.1.tmp", &[0xffu8; 64][..]),
    ] {
        std::fs::write(garbage.join(name), bytes).expect("write");
    }
    for cache in [&file, &garbage] {
        for backend in ["auto", "cpu"] {
            let r = ndfuse(
                &["eval", "2 * 3", "--backend", backend],
                &[("NDFUSE_KERNEL_CACHE_DIR", cache.as_os_str())],
            );
            assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
            match r.code {
                Some(0) => assert!(r.stdout.contains('6'), "{}", r.stdout),
                Some(1) => assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr),
                other => panic!("exit {other:?} with {}", r.stderr),
            }
        }
    }
}
