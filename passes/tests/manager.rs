//! The pass manager's shared work: the pipeline order, the log and its "(unchanged)"
//! marks, disabling by name, dumps, and catching broken passes by verification.

mod common;

use common::Build;
use ndfuse_ir::{BinaryOp, DType, Graph, Node, Op, Scalar, Shape, UnaryOp};
use ndfuse_passes::{
    optimize, pipeline, Pass, PassCx, PassError, PassManager, PassOptions, PassStatus,
};

fn verifying() -> PassOptions {
    PassOptions {
        verify: true,
        ..PassOptions::default()
    }
}

/// `neg(neg(x)) * (1 + 1) + exp(x) * (1 + 1)` with the constants written twice: every
/// pass has something to do.
fn busy_graph() -> Graph {
    let mut g = Graph::new();
    let x = g.add_input("x", DType::F32, Shape::new([4]));
    let n = g.op(Op::Unary(UnaryOp::Neg), &[x]);
    let nn = g.op(Op::Unary(UnaryOp::Neg), &[n]);
    let mut two = || {
        let one = g.add_const(Scalar::F(1.0), DType::F32, Shape::new([4]));
        g.op(Op::Binary(BinaryOp::Add), &[one, one])
    };
    let (t1, t2) = (two(), two());
    let a = g.op(Op::Binary(BinaryOp::Mul), &[nn, t1]);
    let e = g.op(Op::Unary(UnaryOp::Exp), &[x]);
    let b = g.op(Op::Binary(BinaryOp::Mul), &[e, t2]);
    let y = g.op(Op::Binary(BinaryOp::Add), &[a, b]);
    g.add_output(y);
    g
}

#[test]
fn the_pipeline_order() {
    let names: Vec<_> = pipeline().iter().map(|p| p.name()).collect();
    assert_eq!(
        names,
        [
            "fold",
            "simplify",
            "views",
            "gather_views",
            "fuse_attention",
            "sink_reshapes",
            "cse",
            "dce"
        ]
    );
}

#[test]
fn the_log_shows_each_pass_and_marks_unchanged_ones() {
    let g = busy_graph();
    let mut h = g.clone();
    let log = optimize(&mut h, &verifying()).unwrap();
    common::assert_same_values(&g, &h, "pipeline");
    let text = log.to_text(false);
    assert!(text.contains("(unchanged)"));
    insta::assert_snapshot!(text);
    // Display carries the times, Halide style.
    let shown = log.to_string();
    assert!(
        shown.contains("-- pass fold (") && shown.contains(" ms)"),
        "{shown}"
    );
}

#[test]
fn a_clean_graph_takes_one_quiet_lap() {
    let mut g = Graph::new();
    let x = g.add_input("x", DType::F32, Shape::new([4]));
    let y = g.op(Op::Unary(UnaryOp::Exp), &[x]);
    g.add_output(y);
    let before = g.to_string();
    let log = optimize(&mut g, &verifying()).unwrap();
    assert_eq!(g.to_string(), before);
    assert_eq!(log.records.len(), 8);
    assert!(log
        .records
        .iter()
        .all(|r| r.status == PassStatus::Unchanged));
    assert!(!log.changed());
}

#[test]
fn a_disabled_pass_is_skipped_and_reported() {
    let mut g = busy_graph();
    let opts = verifying().with_disabled("cse, fold");
    let log = optimize(&mut g, &opts).unwrap();
    let text = log.to_text(false);
    assert!(text.contains("-- pass cse (disabled)"), "{text}");
    assert!(text.contains("-- pass fold (disabled)"), "{text}");
    let disabled: Vec<_> = log
        .records
        .iter()
        .filter(|r| r.status == PassStatus::Disabled)
        .map(|r| r.name)
        .collect();
    assert_eq!(disabled, ["fold", "cse"]);
    // Without fold and CSE both `1 + 1` stay.
    assert_eq!(g.to_string().matches("add").count(), 3, "{g}");
    insta::assert_snapshot!(text);
}

#[test]
fn unknown_pass_names_are_an_error_but_later_stages_are_accepted() {
    let mut g = busy_graph();
    let err = optimize(&mut g, &verifying().with_disabled("csee")).unwrap_err();
    assert!(matches!(err, PassError::UnknownPass { ref name, .. } if name == "csee"));
    assert_eq!(
        err.to_string(),
        "cannot disable pass \"csee\": no such pass (known: cse, dce, fold, fuse_attention, fusion, gather_views, simplify, sink_reshapes, views)"
    );
    optimize(&mut g, &verifying().with_disabled("fusion")).unwrap();
}

#[test]
fn pass_lists_parse_like_the_environment_variable() {
    assert_eq!(PassOptions::parse_pass_list("cse,fold"), ["cse", "fold"]);
    assert_eq!(
        PassOptions::parse_pass_list(" cse , , dce\t"),
        ["cse", "dce"]
    );
    assert!(PassOptions::parse_pass_list("").is_empty());
}

#[test]
fn the_dump_dir_gets_one_file_per_pass() {
    let dir = std::env::temp_dir().join(format!("ndfuse-passes-dump-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let nested = dir.join("a/b");
    let mut g = busy_graph();
    let input = g.to_string();
    let opts = PassOptions {
        dump_dir: Some(nested.clone()),
        ..verifying()
    };
    let log = optimize(&mut g, &opts).unwrap();
    let mut files: Vec<String> = std::fs::read_dir(&nested)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    assert_eq!(files.len(), log.records.len() + 1);
    assert_eq!(
        &files[..9],
        [
            "00-input.txt",
            "01-fold.txt",
            "02-simplify.txt",
            "03-views.txt",
            "04-gather_views.txt",
            "05-fuse_attention.txt",
            "06-sink_reshapes.txt",
            "07-cse.txt",
            "08-dce.txt",
        ]
    );
    let read = |f: &str| std::fs::read_to_string(nested.join(f)).unwrap();
    assert_eq!(read("00-input.txt"), input);
    assert_eq!(read(files.last().unwrap()), g.to_string());
    // The file of a changing pass holds the IR its log record holds.
    assert_eq!(Some(read("01-fold.txt")), log.records[0].ir_after);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A deliberately broken pass: adds an output typed with a shape its operand cannot
/// give.
#[derive(Debug)]
struct Corrupt;

impl Pass for Corrupt {
    fn name(&self) -> &'static str {
        "corrupt"
    }

    fn run(&self, g: &mut Graph, _cx: &PassCx) -> Result<bool, PassError> {
        let x = g.outputs()[0];
        let dtype = g.node(x).dtype;
        let bad = g.add_node(
            Node {
                op: Op::Unary(UnaryOp::Neg),
                dtype,
                shape: Shape::new([99]),
            },
            &[x],
        );
        g.add_output(bad);
        Ok(true)
    }
}

#[test]
fn verification_names_the_broken_pass_and_shows_the_ir() {
    let mut g = busy_graph();
    let pm = PassManager::new(vec![Box::new(ndfuse_passes::Fold), Box::new(Corrupt)]);
    let err = pm.run(&mut g, &verifying()).unwrap_err();
    assert!(
        matches!(
            err,
            PassError::Verify {
                pass: "corrupt",
                ..
            }
        ),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.starts_with("pass `corrupt` left an invalid graph"),
        "{msg}"
    );
    assert!(
        msg.contains("neg is typed f32[99] but its operands give f32[4]"),
        "{msg}"
    );
    assert!(
        msg.contains("IR after `corrupt`:\n%0 = input \"x\""),
        "{msg}"
    );
    // Without verification the manager trusts the pass.
    let mut g = busy_graph();
    let quiet = PassOptions {
        verify: false,
        max_laps: 1,
        ..PassOptions::default()
    };
    let err = pm.run(&mut g, &quiet).unwrap_err();
    assert!(matches!(err, PassError::LapLimit { laps: 1, .. }), "{err}");
}

#[test]
fn an_invalid_input_is_reported_before_any_pass() {
    let mut g = busy_graph();
    Corrupt.run(&mut g, &PassCx::default()).unwrap();
    let err = optimize(&mut g, &verifying()).unwrap_err();
    assert!(matches!(err, PassError::InvalidInput { .. }), "{err}");
}

/// Changes the graph but says it did not.
#[derive(Debug)]
struct Liar;

impl Pass for Liar {
    fn name(&self) -> &'static str {
        "liar"
    }

    fn run(&self, g: &mut Graph, _cx: &PassCx) -> Result<bool, PassError> {
        g.add_const(Scalar::F(1.0), DType::F32, Shape::scalar());
        Ok(false)
    }
}

#[test]
fn a_wrong_changed_flag_is_caught() {
    let mut g = busy_graph();
    let err = PassManager::new(vec![Box::new(Liar)])
        .run(&mut g, &verifying())
        .unwrap_err();
    assert!(
        matches!(err, PassError::ChangedFlag { pass: "liar", .. }),
        "{err}"
    );
}

/// Always changes the graph: the laps must stop with an error, not spin.
#[derive(Debug)]
struct Restless;

impl Pass for Restless {
    fn name(&self) -> &'static str {
        "restless"
    }

    fn run(&self, g: &mut Graph, _cx: &PassCx) -> Result<bool, PassError> {
        g.add_const(Scalar::F(1.0), DType::F32, Shape::scalar());
        Ok(true)
    }
}

#[test]
fn a_pipeline_that_never_settles_is_an_error() {
    let mut g = busy_graph();
    let opts = PassOptions {
        max_laps: 3,
        ..verifying()
    };
    let err = PassManager::new(vec![Box::new(Restless)])
        .run(&mut g, &opts)
        .unwrap_err();
    assert!(
        matches!(err, PassError::LapLimit { laps: 3, ref changed } if changed == &["restless"]),
        "{err}"
    );
}

#[test]
fn debug_level_3_and_no_recording_still_optimise() {
    // The stderr trace is for people; here it must simply not disturb the result.
    let mut g = busy_graph();
    let opts = PassOptions {
        debug_level: 3,
        record_ir: false,
        ..verifying()
    };
    let log = optimize(&mut g, &opts).unwrap();
    assert!(log.input.is_none());
    assert!(log.records.iter().all(|r| r.ir_after.is_none()));
    assert!(log.to_text(false).contains("(changed; IR not recorded)"));
}
