//! A steady-state eval loop takes (almost) no page faults: outputs of 64 MiB come from
//! the host cache instead of fresh memory. Alone in its binary, because page faults are
//! counted for the whole process.

use ndfuse::Context;
use ndfuse_runtime::minor_page_faults;

#[test]
fn a_steady_state_eval_loop_of_64_mib_outputs_takes_almost_no_page_faults() {
    // 64 MiB is above glibc's largest mmap threshold (32 MiB), so without the cache
    // every output would be a fresh mapping: 16 384 faults with 4 KiB pages, several
    // hundred with huge pages. The default cacheable length (256 MiB) keeps it: no
    // configuration is set here, so this is what a user gets out of the box.
    let ctx = Context::new();
    let x = ctx.rand_uniform(&[16 << 20], -1.0, 1.0, 1);
    let y = &x * 2.0 + 1.0;
    // Warm-up: kernel compiled, output buffer cached.
    drop(y.eval().expect("runs"));
    let first = y.eval().expect("runs");
    let ptr = first.as_host().storage().as_ptr();
    drop(first);
    let before = minor_page_faults().expect("Linux counts minor faults");
    const EVALS: u64 = 8;
    for _ in 0..EVALS {
        let out = y.eval().expect("runs");
        assert_eq!(out.as_host().storage().as_ptr(), ptr, "the same buffer");
        drop(out);
    }
    let per_eval = (minor_page_faults().expect("counted") - before) / EVALS;
    assert!(
        per_eval < 100,
        "{per_eval} minor faults per eval of a 64 MiB output (a fresh one costs hundreds)"
    );
    let stats = ctx.cache_stats();
    assert!(stats.hits > EVALS, "{stats}");
}
