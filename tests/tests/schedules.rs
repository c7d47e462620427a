//! Snapshots of the kernel descriptions fusion produces (the contract both codegens
//! consume): which nodes share a kernel, what is loaded through which index map, what is
//! stored and why. Each test also asserts the kernel count.

use ndfuse::{Context, SliceArg, Tensor};

fn schedule_text(ctx: &Context, outs: &[&Tensor]) -> (usize, String) {
    let g = ctx.graph(outs).expect("builds");
    let s = ndfuse_passes::schedule(&g);
    let text = format!("{}\n{}", s.annotate(&g, &|_| None), s.to_text(&g));
    (s.kernel_count(), text)
}

#[test]
fn broadcast_row_and_column_fold_into_strided_loads() {
    let ctx = Context::new();
    let a = ctx.zeros(&[4, 1]);
    let x = ctx.rand_uniform(&[4, 3], 0.0, 1.0, 1);
    let b = ctx.rand_uniform(&[3], 0.0, 1.0, 2);
    let (n, text) = schedule_text(&ctx, &[&((&x + &b) * (&x - &a).exp())]);
    assert_eq!(n, 1);
    insta::assert_snapshot!(text);
}

#[test]
fn a_diamond_computes_its_shared_value_once_and_stores_two_outputs() {
    let ctx = Context::new();
    let x = ctx.rand_uniform(&[8], 0.0, 1.0, 3);
    let t = x.tanh();
    let (n, text) = schedule_text(&ctx, &[&(&t * &t + 1.0), &t.sin()]);
    assert_eq!(n, 1);
    insta::assert_snapshot!(text);
}

#[test]
fn reversed_slices_and_transposes_become_negative_and_swapped_strides() {
    let ctx = Context::new();
    let x = ctx.rand_uniform(&[6, 4], 0.0, 1.0, 4);
    let y = ctx.rand_uniform(&[3, 3], 0.0, 1.0, 5);
    let r = x.slice(&[SliceArg::new(None, None, -2), SliceArg::from(1..4)]);
    let (n, text) = schedule_text(&ctx, &[&(&r * &y.transpose())]);
    assert_eq!(n, 1);
    insta::assert_snapshot!(text);
}

#[test]
fn a_value_read_through_a_view_is_a_kernel_boundary() {
    let ctx = Context::new();
    let x = ctx.rand_uniform(&[3, 3], 0.0, 1.0, 6);
    let e = x.exp();
    let (n, text) = schedule_text(&ctx, &[&(&e + &e.transpose())]);
    assert_eq!(n, 2, "{text}");
    insta::assert_snapshot!(text);
}

#[test]
fn reshaping_a_transpose_copies_it_first() {
    let ctx = Context::new();
    let x = ctx.rand_uniform(&[2, 3], 0.0, 1.0, 7);
    let (n, text) = schedule_text(&ctx, &[&(x.transpose().reshape(&[6]) * 2.0)]);
    assert_eq!(n, 2, "{text}");
    insta::assert_snapshot!(text);
}
