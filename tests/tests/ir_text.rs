//! Snapshots of the text IR that the frontend builds for representative expressions:
//! they pin how numpy's implicit rules (broadcasting, promotion, weak literals, negative
//! axes) become explicit casts and views, and the printer's stable format.

use ndfuse::{Context, DType, SliceArg, Tensor};

fn ctx() -> Context {
    Context::new()
}

fn input(ctx: &Context, shape: &[usize], dtype: DType) -> Tensor {
    let n = shape.iter().product();
    match dtype {
        DType::F32 => ctx.from_vec(vec![0.5f32; n], shape),
        DType::F64 => ctx.from_vec(vec![0.5f64; n], shape),
        DType::F16 => ctx.from_vec(vec![half::f16::from_f32(0.5); n], shape),
        DType::I32 => ctx.from_vec(vec![1i32; n], shape),
        DType::I64 => ctx.from_vec(vec![1i64; n], shape),
        DType::Bool => ctx.from_vec(vec![true; n], shape),
        DType::BF16 => ctx.from_vec(vec![half::bf16::from_f32(0.5); n], shape),
    }
    .expect("element count matches")
}

fn text(ctx: &Context, outs: &[&Tensor]) -> String {
    ctx.graph_text(outs).expect("builds")
}

macro_rules! snap {
    ($name:ident, |$c:ident| $body:expr) => {
        #[test]
        fn $name() {
            let $c = ctx();
            let outs: Vec<Tensor> = $body;
            let refs: Vec<&Tensor> = outs.iter().collect();
            insta::assert_snapshot!(text(&$c, &refs));
        }
    };
}

snap!(add_same_shape, |c| {
    let (a, b) = (
        input(&c, &[4, 8], DType::F32),
        input(&c, &[4, 8], DType::F32),
    );
    vec![&a + &b]
});

snap!(broadcast_column_and_row, |c| {
    let (a, b) = (input(&c, &[4, 1], DType::F32), input(&c, &[3], DType::F32));
    vec![&a + &b]
});

snap!(weak_scalar_literal_keeps_f16, |c| {
    let a = input(&c, &[5], DType::F16);
    vec![&a * 2.0 - 1]
});

snap!(f16_plus_f32_promotes_to_f32, |c| {
    let (a, b) = (
        input(&c, &[2, 3], DType::F16),
        input(&c, &[2, 3], DType::F32),
    );
    vec![&a + &b]
});

snap!(int_with_float_literal_promotes_to_f64, |c| {
    let a = input(&c, &[3], DType::I32);
    vec![&a * 1.5]
});

snap!(int_true_division_is_f64, |c| {
    let (a, b) = (input(&c, &[3], DType::I32), input(&c, &[3], DType::I64));
    vec![&a / &b]
});

snap!(float_function_of_int_is_f64, |c| {
    let a = input(&c, &[3], DType::I64);
    vec![a.exp(), a.abs()]
});

snap!(gelu_tanh_form, |c| {
    let a = input(&c, &[16], DType::F32);
    vec![a.gelu()]
});

snap!(softmax_last_axis, |c| {
    let a = input(&c, &[4, 8], DType::F32);
    vec![a.softmax(-1)]
});

snap!(log_softmax_first_axis, |c| {
    let a = input(&c, &[4, 8], DType::F64);
    vec![a.log_softmax(0)]
});

snap!(layernorm, |c| {
    let a = input(&c, &[2, 6], DType::F32);
    vec![a.layernorm(-1, 1e-5)]
});

snap!(exp_of_fma_summed, |c| {
    let (a, b, d) = (
        input(&c, &[4, 8], DType::F32),
        input(&c, &[4, 8], DType::F32),
        input(&c, &[8], DType::F32),
    );
    vec![(&a * &b + &d).exp().sum(1)]
});

snap!(reductions_keepdims_and_all, |c| {
    let a = input(&c, &[2, 3, 4], DType::F32);
    vec![
        a.sum_keepdims([0, -1]),
        a.mean(..),
        a.max(1),
        a.var(-1),
        a.std_keepdims(..),
    ]
});

snap!(int_sum_accumulates_in_i64, |c| {
    let a = input(&c, &[6], DType::I32);
    vec![a.sum(..), a.mean(..)]
});

snap!(argmax_and_argmin, |c| {
    let a = input(&c, &[3, 5], DType::F32);
    vec![a.argmax(1), a.argmin_keepdims(0)]
});

snap!(slices_with_steps_and_permute, |c| {
    let a = input(&c, &[10, 6], DType::F32);
    let s = a.slice(&[SliceArg::from(1..9).step(2), SliceArg::new(None, None, -1)]);
    vec![
        s.transpose(),
        a.slice(&[SliceArg::new(Some(3), Some(0), -2)]),
    ]
});

snap!(reshape_expand_squeeze, |c| {
    let a = input(&c, &[4, 6], DType::F32);
    vec![
        a.reshape(&[2, -1, 3]).expand_dims(0).squeeze(&[0]),
        a.broadcast_to(&[2, 4, 6]),
    ]
});

snap!(where_relu_and_masks, |c| {
    let a = input(&c, &[5], DType::F32);
    let m = a.gt(0.0).and(a.lt(1.0));
    vec![m.where_(&a, 0.0), m.logical_not()]
});

snap!(casts_between_dtypes, |c| {
    let a = input(&c, &[4], DType::I32);
    vec![a.cast(DType::F16).cast(DType::BF16), a.cast(DType::Bool)]
});

snap!(two_outputs_share_one_graph, |c| {
    let a = input(&c, &[4, 4], DType::F32);
    let t = (&a * 3.0).tanh();
    vec![t.sum(0), &t + 1.0]
});

#[test]
fn dot_output_names_every_node_and_edge() {
    let c = ctx();
    let a = input(&c, &[2], DType::F32);
    let y = (&a * &a).sqrt();
    let (g, _) = (c.graph_text(&[&y]).expect("builds"), ());
    assert!(g.contains("mul %0, %0"), "{g}");
    let rep = c.eval_report(&[&y]).expect("evaluates").1;
    let dot = rep.graph().to_dot();
    insta::assert_snapshot!(dot);
}
