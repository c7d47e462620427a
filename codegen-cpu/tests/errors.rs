//! Errors: arguments that do not fit a compiled kernel, and kernels this code generator
//! refuses (malformed descriptions it must not compile; half types are compiled).

mod builder;

use builder::{compiled, iota, view, KernelBuilder};
use ndfuse_codegen_cpu::{compile, supports, CodegenError};
use ndfuse_ir::{BinaryOp, DType, Expr, HostArray, Instr, Kernel, Shape, Store, UnaryOp, ValueId};

fn add_kernel() -> Kernel {
    let mut kb = KernelBuilder::new("k0_add", &[2, 3]);
    let a = kb.load(DType::F32);
    let b = kb.load(DType::F32);
    let c = kb.binary(BinaryOp::Add, a, b);
    kb.store(c);
    kb.build()
}

fn args_detail(e: CodegenError) -> String {
    match e {
        CodegenError::Args { kernel, detail } => {
            assert_eq!(kernel, "k0_add");
            detail
        }
        other => panic!("expected an Args error, got {other}"),
    }
}

#[test]
fn wrong_arguments_are_named() {
    let ck = compiled(&add_kernel());
    let a = iota(DType::F32, &[2, 3]);
    let mut out = HostArray::zeros(DType::F32, Shape::new([2, 3]));

    let e = ck.run(&[&a], &mut [&mut out]).expect_err("one input short");
    assert_eq!(
        e.to_string(),
        "kernel k0_add: bad arguments: expected 2 inputs, got 1"
    );

    let mut out2 = out.clone();
    let e = ck
        .run(&[&a, &a], &mut [&mut out, &mut out2])
        .expect_err("one output too many");
    assert_eq!(args_detail(e), "expected 1 output, got 2");

    let wrong_dtype = iota(DType::F64, &[2, 3]);
    let e = ck
        .run(&[&a, &wrong_dtype], &mut [&mut out])
        .expect_err("f64 input");
    assert_eq!(args_detail(e), "input 1 is f64, the kernel needs f32");

    let short = iota(DType::F32, &[5]);
    let e = ck
        .run(&[&short, &a], &mut [&mut out])
        .expect_err("5 elements");
    assert_eq!(args_detail(e), "input 0 has 5 elements, the kernel needs 6");

    let mut bad_out = HostArray::zeros(DType::I32, Shape::new([2, 3]));
    let e = ck
        .run(&[&a, &a], &mut [&mut bad_out])
        .expect_err("i32 output");
    assert_eq!(args_detail(e), "output 0 is i32, the kernel needs f32");

    let mut long_out = HostArray::zeros(DType::F32, Shape::new([7]));
    let e = ck
        .run(&[&a, &a], &mut [&mut long_out])
        .expect_err("7 elements");
    assert_eq!(
        args_detail(e),
        "output 0 has 7 elements, the kernel needs 6"
    );

    let e = ck
        .run_range(&[&a, &a], &mut [&mut out], 4, 7)
        .expect_err("past the end");
    assert_eq!(args_detail(e), "range 4..7 is not within the domain's 0..6");
    let e = ck
        .run_range(&[&a, &a], &mut [&mut out], 4, 3)
        .expect_err("reversed");
    assert_eq!(args_detail(e), "range 4..3 is not within the domain's 0..6");

    // Nothing ran: the output is still zero.
    assert_eq!(out.to_f64s(), vec![0.0; 6]);
    ck.run(&[&a, &a], &mut [&mut out]).expect("now it fits");
    assert_eq!(out.to_f64s(), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
}

#[test]
fn half_kernels_are_compiled_not_refused() {
    // They were left to the interpreter before f16/bf16 were lowered (computed in f32):
    // now they compile and give the reference's bits (tests/half.rs covers them all).
    for d in [DType::F16, DType::BF16] {
        let mut kb = KernelBuilder::new("k0_exp", &[4]);
        let x = kb.load(d);
        let y = kb.unary(UnaryOp::Exp, x);
        kb.store(y);
        let k = kb.build();
        assert_eq!(supports(&k), Ok(()));
        let a = HostArray::from_f64s(d, Shape::new([4]), &[0.0, 1.0, -2.5, 11.0]);
        let mut out = HostArray::zeros(d, Shape::new([4]));
        compiled(&k)
            .run(&[&a], &mut [&mut out])
            .expect("arguments fit");
        let want = ndfuse_ir::interp::eval_kernel(&k, &[&a]).expect("reference");
        assert_eq!(out.storage(), want[0].storage(), "{d}");
    }
    // A cast from f16 in an otherwise f32 kernel compiles too.
    let mut kb = KernelBuilder::new("k0_cast", &[4]);
    let x = kb.load(DType::F16);
    let y = kb.cast(x, DType::F32);
    kb.store(y);
    assert_eq!(supports(&kb.build()), Ok(()));
}

fn refused(kernel: &Kernel) -> String {
    let why = supports(kernel).expect_err("a malformed kernel is refused");
    assert!(matches!(
        compile(kernel),
        Err(CodegenError::Unsupported { .. })
    ));
    why
}

#[test]
fn malformed_kernels_are_refused_not_compiled() {
    // Arithmetic on bools could store a byte other than 0 or 1 into a Vec<bool>.
    let mut k = add_kernel();
    k.inputs
        .iter_mut()
        .chain(k.outputs.iter_mut())
        .for_each(|b| b.dtype = DType::Bool);
    k.body.iter_mut().for_each(|i| i.dtype = DType::Bool);
    let why = refused(&k);
    assert!(why.contains("v2: add: bool[] is not allowed"), "{why}");

    // Operands of different dtypes.
    let mut kb = KernelBuilder::new("k0_mix", &[3]);
    let a = kb.load(DType::F32);
    let b = kb.load(DType::F64);
    let mut k = {
        let c = kb.binary(BinaryOp::Mul, a, b);
        kb.store(c);
        kb.build_unchecked()
    };
    let why = refused(&k);
    assert!(
        why.contains("mul: operands f32[] and f64[] must have the same dtype"),
        "{why}"
    );

    // A view reading past its buffer (which Kernel::check also reports).
    k = add_kernel();
    if let Expr::Load { view: v, .. } = &mut k.body[0].expr {
        v.offset = 1;
    }
    let why = refused(&k);
    assert!(
        why.contains("invalid kernel description") && why.contains("in0"),
        "{why}"
    );

    // A view with fewer strides than axes.
    let mut kb = KernelBuilder::new("k0_short_strides", &[2, 3]);
    let x = kb.load_view(DType::F32, 6, view(&[2, 3], &[1], 0));
    kb.store(x);
    let k = kb.build_unchecked();
    // Offsets along the second axis would be missing: Kernel::check refuses it.
    assert!(k.check().is_err());
    let why = refused(&k);
    assert!(why.contains("does not map the domain [2,3]"), "{why}");

    // An output stored twice.
    let mut k = add_kernel();
    k.stores.push(Store {
        value: ValueId(2),
        output: 0,
    });
    let why = refused(&k);
    assert!(why.contains("out0 is stored 2 times"), "{why}");

    // Integer division is not an op of the IR.
    let mut k = add_kernel();
    k.inputs
        .iter_mut()
        .chain(k.outputs.iter_mut())
        .for_each(|b| b.dtype = DType::I32);
    k.body.iter_mut().for_each(|i| i.dtype = DType::I32);
    k.body[2] = Instr {
        dtype: DType::I32,
        expr: Expr::Binary(BinaryOp::Div, ValueId(0), ValueId(1)),
    };
    let why = refused(&k);
    assert!(why.contains("v2: div: i32[] is not allowed"), "{why}");
}
