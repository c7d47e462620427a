//! Deep graphs (issue 18, item 2): a chain of a million element-wise ops, a 100,000-long
//! chain of views, a deep DAG with sharing, and dropping such chains neither overflow the
//! stack nor lose a value. Each case runs on a thread with a 2 MiB stack (Rust's default
//! for spawned threads and tests) in a child process, so that a walk bounded only by the
//! stack shows as a failed test naming the case, not as an abort of the harness.

use ndfuse::{BackendKind, Context, Tensor};

/// The stack every case gets: what a test thread gets by default.
const STACK: usize = 2 << 20;

/// Set in the child process to the case it runs.
const CHILD: &str = "DEEP_GRAPHS_CASE";

/// The element-wise chain's length: a million in release builds; 200,000 in debug
/// builds, where a million takes minutes (`cargo test --release --test deep_graphs` runs
/// the full length).
fn chain_len() -> usize {
    if let Some(n) = std::env::var("DEEP_GRAPHS_CHAIN")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return n;
    }
    if cfg!(debug_assertions) {
        200_000
    } else {
        1_000_000
    }
}

/// Runs `body` as `case` in a child process (this test binary again, only that test),
/// on a thread with a [`STACK`]-byte stack there; fails with the child's output when it
/// failed or died (a stack overflow is a SIGABRT).
fn in_child(case: &str, body: fn()) {
    if std::env::var(CHILD).as_deref() == Ok(case) {
        std::thread::Builder::new()
            .name(case.to_string())
            .stack_size(STACK)
            .spawn(body)
            .expect("a thread")
            .join()
            .expect("the case passes");
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().expect("the test binary"))
        .args([case, "--exact", "--nocapture", "--test-threads", "1"])
        .env(CHILD, case)
        .output()
        .expect("the test binary runs again");
    assert!(
        out.status.success(),
        "{case} failed in its child process ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Evaluates `t` on `backend` as f64 values.
fn values(ctx: &Context, t: &Tensor, backend: BackendKind) -> Vec<f64> {
    ctx.set_backend(backend);
    t.eval()
        .unwrap_or_else(|e| panic!("{backend:?} evaluates: {e}"))
        .to_vec::<f64>()
        .expect("f64 values")
}

/// `x + 1 + 1 + ...` built through the library API, `chain_len()` additions.
fn add_chain(ctx: &Context, n: usize) -> Tensor {
    let x = ctx.from_vec(vec![0.0f64, 1.5, -3.0, 1e6], &[4]).expect("x");
    let mut t = x;
    for _ in 0..n {
        t = &t + 1.0;
    }
    t
}

#[test]
fn a_million_op_elementwise_chain_evaluates() {
    in_child("a_million_op_elementwise_chain_evaluates", || {
        let n = chain_len();
        let ctx = Context::new();
        let t = add_chain(&ctx, n);
        let want: Vec<f64> = [0.0f64, 1.5, -3.0, 1e6]
            .iter()
            .map(|v| v + n as f64)
            .collect();
        for backend in [BackendKind::Cpu, BackendKind::Interp] {
            assert_eq!(
                values(&ctx, &t, backend),
                want,
                "{backend:?}, {n} additions"
            );
        }
    });
}

#[test]
fn a_100k_chain_of_views_evaluates() {
    in_child("a_100k_chain_of_views_evaluates", || {
        let ctx = Context::new();
        let data: Vec<f64> = (0..6).map(f64::from).collect();
        let x = ctx.from_vec(data.clone(), &[2, 3]).expect("x");
        // [2,3] -T-> [3,2] -reshape-> [1,6] -T-> [6,1] -reshape-> [2,3] ...: transposes
        // of real data and of unit axes, reshapes of contiguous and strided views.
        let mut t = x;
        let mut steps = 0;
        while steps < 100_000 {
            t = t.transpose().reshape(&[1, 6]).transpose().reshape(&[3, 2]);
            t = t.transpose();
            steps += 5;
        }
        let want = values(&ctx, &t, BackendKind::Interp);
        assert_eq!(want.len(), 6);
        assert_eq!(values(&ctx, &t, BackendKind::Cpu), want, "cpu vs interp");
        // Each round of five is a permutation of the six values.
        let mut sorted = want.clone();
        sorted.sort_by(f64::total_cmp);
        assert_eq!(sorted, data);
    });
}

/// `x_{i+1} = x_i * x_i + x_i`, `depth` times: each level uses its operand twice, so a
/// walk that does not remember what it visited takes 2^depth steps.
fn shared_dag(ctx: &Context, depth: usize) -> Tensor {
    let mut t = ctx.from_vec(vec![0.0f64, -1.0, 1.0], &[3]).expect("x");
    for _ in 0..depth {
        t = &(&t * &t) + &t;
    }
    t
}

#[test]
fn a_deep_dag_with_sharing_evaluates() {
    in_child("a_deep_dag_with_sharing_evaluates", || {
        let ctx = Context::new();
        let t = shared_dag(&ctx, 100_000);
        let want = vec![0.0, 0.0, f64::INFINITY];
        for backend in [BackendKind::Cpu, BackendKind::Interp] {
            assert_eq!(values(&ctx, &t, backend), want, "{backend:?}");
        }
    });
}

#[test]
fn dropping_deep_chains_does_not_overflow() {
    in_child("dropping_deep_chains_does_not_overflow", || {
        let ctx = Context::new();
        drop(add_chain(&ctx, 1_000_000));
        drop(shared_dag(&ctx, 1_000_000));
        // A chain whose nodes are still shared by a second handle halfway down.
        let mut t = ctx.from_vec(vec![1.0f64], &[1]).expect("x");
        let mut keep = None;
        for i in 0..1_000_000 {
            t = t.exp();
            if i == 500_000 {
                keep = Some(t.clone());
            }
        }
        drop(t);
        drop(keep);
    });
}
