//! Kernel evaluation: a kernel description run element by element (chunks of the
//! domain), or row by row when it has reduce axes, with the backends' rounding.

use super::elementwise::{cast, map_binary, map_unary, select};
use super::error::InterpError;
use super::reduce::{arg_f64, arg_i64, reduce_f64, reduce_i64};
use super::vals::{Tensor, Vals};
use super::views::Offsets;
use crate::array::HostArray;
use crate::dtype::{DType, Scalar};
use crate::kernel::{Expr, Kernel};
use crate::op::ReduceOp;
use crate::round::{round_f64, wrap_int};
use crate::shape::{Shape, View};

/// Domain positions evaluated at a time: bounds memory to a chunk per SSA value.
const CHUNK: usize = 4096;

/// Checks the arrays against the kernel's buffers and the body's types (with the graph's
/// typing rules), returning what does not fit.
fn check_kernel(kernel: &Kernel, inputs: &[&HostArray]) -> Result<(), String> {
    // A contraction's product is the last input, filled here, not bound by the caller.
    let bound = kernel.inputs.len() - usize::from(kernel.contraction.is_some());
    if inputs.len() != bound {
        return Err(format!("takes {bound} inputs, got {}", inputs.len()));
    }
    for (i, (a, b)) in inputs.iter().zip(&kernel.inputs).enumerate() {
        if a.dtype() != b.dtype || a.len() != b.len {
            return Err(format!(
                "in{i} must be {}[{}], got {} with {} elements",
                b.dtype,
                b.len,
                a.dtype(),
                a.len()
            ));
        }
    }
    kernel
        .check()
        .map_err(|errs| format!("malformed: {}", errs.join("; ")))
}

/// Evaluates a kernel description element by element. `inputs` are in
/// [`Kernel::inputs`] order (without a contraction's product, which is computed first); the result has one array per [`Kernel::outputs`], each
/// shaped like `kernel.domain`.
///
/// Kernel semantics differ from graph semantics in one way: every instruction's float
/// result is rounded to its dtype's [`DType::compute_dtype`](crate::DType::compute_dtype)
/// (f32 for f16/bf16, so half math runs in f32), and to the storage dtype only when
/// stored. f64 never rounds.
pub fn eval_kernel(kernel: &Kernel, inputs: &[&HostArray]) -> Result<Vec<HostArray>, InterpError> {
    check_kernel(kernel, inputs).map_err(|detail| InterpError::KernelArgs {
        kernel: kernel.name.clone(),
        detail,
    })?;
    check_indices(kernel, inputs)?;
    // Every output as computed (8 bytes an element) and stored, and the product.
    let elem_bytes = kernel
        .outputs
        .iter()
        .map(|b| 8 + b.dtype.size_bytes())
        .sum::<usize>()
        + if kernel.contraction.is_some() { 8 } else { 0 };
    super::error::room_for(kernel.domain.dims(), elem_bytes, || {
        format!("kernel {} over {}", kernel.name, kernel.domain)
    })?;
    let mut bufs: Vec<Vals> = inputs
        .iter()
        .map(|a| Vals::from_storage(a.storage()))
        .collect();
    if let Some(c) = &kernel.contraction {
        let dtypes: Vec<DType> = kernel.inputs.iter().map(|b| b.dtype).collect();
        bufs.push(super::contract::product(c, &bufs, &dtypes));
    }
    if !kernel.reduce_axes.is_empty() {
        return Ok(eval_row_program(kernel, &bufs));
    }
    let n = kernel.domain.numel();
    let mut outs: Vec<Vals> = kernel
        .outputs
        .iter()
        .map(|b| match b.dtype.kind() {
            crate::dtype::DKind::Float => Vals::F(Vec::with_capacity(n)),
            crate::dtype::DKind::Int => Vals::I(Vec::with_capacity(n)),
            crate::dtype::DKind::Bool => Vals::B(Vec::with_capacity(n)),
        })
        .collect();
    let mut start = 0;
    while start < n {
        let len = CHUNK.min(n - start);
        let mut vals: Vec<Vals> = Vec::with_capacity(kernel.body.len());
        for ins in &kernel.body {
            let positions = |view: &View| {
                Offsets::starting_at(view.shape.dims(), &view.strides, view.offset, start)
                    .take(len)
                    .collect::<Vec<usize>>()
            };
            let v = eval_instr(kernel, ins, &vals, len, |at| match at {
                Read::Buffer(input, view) => bufs[input].gather(positions(view).into_iter()),
                Read::Positions(view) => {
                    Vals::I(positions(view).into_iter().map(|p| p as i64).collect())
                }
                Read::Gather(input, view, extra) => bufs[input].gather(
                    positions(view)
                        .into_iter()
                        .zip(extra)
                        .map(|(p, e)| (p as isize + e) as usize),
                ),
            });
            vals.push(v);
        }
        for s in &kernel.stores {
            let dtype = kernel.outputs[s.output].dtype;
            match (&mut outs[s.output], &vals[s.value.index()]) {
                (Vals::F(o), Vals::F(v)) => o.extend(v.iter().map(|&x| round_f64(x, dtype))),
                (Vals::I(o), Vals::I(v)) => o.extend(v.iter().map(|&x| wrap_int(x, dtype))),
                (Vals::B(o), Vals::B(v)) => o.extend_from_slice(v),
                _ => panic!("a store of another kind than its buffer passed Kernel::check (a bug)"),
            }
        }
        start += len;
    }
    Ok(outs
        .into_iter()
        .zip(&kernel.outputs)
        .map(|(v, b)| {
            Tensor {
                dtype: b.dtype,
                shape: kernel.domain.clone(),
                vals: v,
            }
            .into_host()
        })
        .collect())
}

/// Checks the user indices a kernel reads through ([`Kernel::index_checks`]) against
/// their axes: every backend calls this before the kernel runs, so an index out of range
/// is an error and never a read. `inputs` are in [`Kernel::inputs`] order (a product,
/// if any, may be missing: indices are never products).
pub fn check_indices(kernel: &Kernel, inputs: &[&HostArray]) -> Result<(), InterpError> {
    for c in kernel.index_checks() {
        if let Some(a) = inputs.get(c.input) {
            check_index(&c, a)?;
        }
    }
    Ok(())
}

/// [`check_indices`] for one check, on its index array `a` (the kernel's input
/// `c.input`, wherever it was read from).
pub fn check_index(c: &crate::kernel::IndexCheck, a: &HostArray) -> Result<(), InterpError> {
    let n = c.extent as i64;
    let bad = |k: i64| k < -n || k >= n;
    // Each index once: the axes the view broadcasts (stride 0) are walked at 0 only.
    let view = View {
        shape: Shape::new(
            c.view
                .shape
                .dims()
                .iter()
                .zip(&c.view.strides)
                .map(|(&d, &st)| if st == 0 { d.min(1) } else { d })
                .collect::<Vec<_>>(),
        ),
        strides: c.view.strides.clone(),
        offset: c.view.offset,
    };
    let offs = Offsets::of_view(&view);
    let found = match a.storage() {
        crate::array::Storage::I64(v) => offs
            .enumerate()
            .find(|&(_, o)| bad(v[o]))
            .map(|(p, o)| (p, v[o])),
        crate::array::Storage::I32(v) => offs
            .enumerate()
            .find(|&(_, o)| bad(i64::from(v[o])))
            .map(|(p, o)| (p, i64::from(v[o]))),
        _ => None,
    };
    match found {
        Some((p, value)) => Err(InterpError::IndexOutOfRange {
            op: "gather",
            axis: c.axis,
            value,
            position: view.shape.unravel(p),
            extent: c.extent,
        }),
        None => Ok(()),
    }
}

/// What [`eval_instr`] asks its caller to read through an instruction's view.
enum Read<'v> {
    /// The elements of input `.0` the view reaches.
    Buffer(usize, &'v View),
    /// The positions the view reaches (a random op's own row-major indices), as i64.
    Positions(&'v View),
    /// The elements of input `.0` at the view's offsets plus `.2` (a gather's computed
    /// part, one per position).
    Gather(usize, &'v View, Vec<isize>),
}

/// The computed part of a gather's offsets over `width` positions: each axis's index,
/// wrapped when negative and clamped into the axis, times its stride.
fn gather_extra(axes: &[crate::kernel::GatherAxis], vals: &[Vals], width: usize) -> Vec<isize> {
    let mut extra = vec![0isize; width];
    for a in axes {
        let Vals::I(ks) = &vals[a.index.index()] else {
            unreachable!("gather indices are integers (Kernel::check)")
        };
        let n = a.extent as i64;
        for (e, &k) in extra.iter_mut().zip(ks) {
            let k = if k < 0 { k + n } else { k };
            *e += k.clamp(0, (n - 1).max(0)) as isize * a.stride;
        }
    }
    extra
}

/// One instruction of a kernel over `width` positions (a chunk of the domain, or one
/// row with row values replicated along it); `read` gathers an input through a view,
/// or lists the positions a view reaches.
/// Reductions combine the whole vector: only the row program may have them.
fn eval_instr(
    kernel: &Kernel,
    ins: &crate::kernel::Instr,
    vals: &[Vals],
    width: usize,
    read: impl FnOnce(Read<'_>) -> Vals,
) -> Vals {
    let round_to = ins.dtype.compute_dtype();
    match &ins.expr {
        Expr::Load { input, view } => read(Read::Buffer(*input, view)),
        Expr::Random { key, view } => {
            let key = super::random::key_of(&vals[key.index()]);
            match read(Read::Positions(view)) {
                Vals::I(p) => super::random::uniform_at(key, p.into_iter().map(|p| p as usize)),
                _ => unreachable!("positions are i64"),
            }
        }
        Expr::Position { view } => read(Read::Positions(view)),
        Expr::Gather { input, view, axes } => {
            read(Read::Gather(*input, view, gather_extra(axes, vals, width)))
        }
        Expr::Const(c) => Vals::fill(*c, ins.dtype, round_to, width),
        Expr::Unary(u, a) => map_unary(*u, &vals[a.index()], round_to),
        Expr::Binary(b, x, y) => {
            // A comparison's dtype is bool; its operands' dtype decides the math.
            let round_to = kernel.body[x.index()].dtype.compute_dtype();
            map_binary(*b, &vals[x.index()], &vals[y.index()], round_to)
        }
        Expr::Where(c, a, b) => select(&vals[c.index()], &vals[a.index()], &vals[b.index()]),
        // An explicit cast asks for the target's precision, even to a half type.
        Expr::Cast(a) => cast(&vals[a.index()], ins.dtype, ins.dtype),
        Expr::Reduce(acc, a) => {
            let op = match acc {
                crate::kernel::Accumulate::Sum => ReduceOp::Sum,
                crate::kernel::Accumulate::Prod => ReduceOp::Prod,
                crate::kernel::Accumulate::Max => ReduceOp::Max,
                crate::kernel::Accumulate::Min => ReduceOp::Min,
            };
            match &vals[a.index()] {
                Vals::F(lane) => Vals::F(vec![round_f64(reduce_f64(op, lane), round_to); width]),
                Vals::I(lane) => Vals::I(vec![wrap_int(reduce_i64(op, lane), ins.dtype); width]),
                Vals::B(_) => unreachable!("Kernel::check refuses bool reductions"),
            }
        }
        Expr::ArgReduce(op, a) => {
            let idx = match &vals[a.index()] {
                Vals::F(lane) => arg_f64(*op, lane.iter().copied()),
                Vals::I(lane) => arg_i64(*op, lane.iter().copied()),
                Vals::B(lane) => arg_i64(*op, lane.iter().map(|&b| i64::from(b))),
            };
            Vals::I(vec![idx; width])
        }
    }
}

/// [`eval_kernel`] for a kernel with reduce axes: the row program of the kernel docs, one
/// row at a time. Row values are kept replicated along the row, so the element-wise maps
/// apply unchanged; reductions combine in f64 (sums compensated) and round once to the
/// instruction's compute dtype, as a kernel rounds its accumulator once.
/// The one element a row-level load reads for row `r` of an empty row: `view` is
/// permuted kept axes first, and its first `kept` axes are the kept ones. A view that
/// reaches outside its buffer (which `Kernel::check` cannot bound over an empty domain)
/// reads NaN, never out of bounds; kernels built by the passes never do.
fn row_element(buf: &Vals, view: &View, kept: usize, r: usize, dtype: crate::dtype::DType) -> Vals {
    let offset = row_offset(view, kept, r);
    match usize::try_from(offset).ok().filter(|&o| o < buf.len()) {
        Some(o) => buf.gather(std::iter::once(o)),
        None => Vals::fill(Scalar::F(f64::NAN), dtype, dtype, 1),
    }
}

/// The offset `view` maps row `r`'s kept index to (its first `kept` axes are the kept
/// ones), for a row value of an empty row.
fn row_offset(view: &View, kept: usize, r: usize) -> isize {
    let dims = &view.shape.dims()[..kept];
    let mut rest = r;
    let mut offset = view.offset;
    for (a, &d) in dims.iter().enumerate().rev() {
        let idx = rest % d.max(1);
        rest /= d.max(1);
        offset += idx as isize * view.strides[a];
    }
    offset
}

fn eval_row_program(kernel: &Kernel, bufs: &[Vals]) -> Vec<HostArray> {
    use crate::kernel::Level;
    let dims = kernel.domain.dims();
    let kept: Vec<usize> = (0..dims.len())
        .filter(|a| !kernel.reduce_axes.contains(a))
        .collect();
    // Domain axes reordered kept-first: position r * row_len + j is element j of row r.
    let perm: Vec<usize> = kept.iter().chain(&kernel.reduce_axes).copied().collect();
    let (rows, row_len) = (kernel.rows(), kernel.row_len());
    let width = row_len.max(1);
    let levels = kernel.levels();
    let views: Vec<Option<View>> = kernel
        .body
        .iter()
        .map(|ins| match &ins.expr {
            Expr::Load { view, .. }
            | Expr::Random { view, .. }
            | Expr::Position { view }
            | Expr::Gather { view, .. } => Some(view.permute(&perm)),
            _ => None,
        })
        .collect();
    let out_view = View::contiguous(kernel.domain.clone()).permute(&perm);
    let mut outs: Vec<Vals> = kernel
        .stores
        .iter()
        .map(|st| {
            let b = &kernel.outputs[st.output];
            let len = b.len;
            match b.dtype.kind() {
                crate::dtype::DKind::Float => Vals::F(vec![0.0; len]),
                crate::dtype::DKind::Int => Vals::I(vec![0; len]),
                crate::dtype::DKind::Bool => Vals::B(vec![false; len]),
            }
        })
        .collect();
    for r in 0..rows {
        let first = r * row_len;
        let mut vals: Vec<Vals> = Vec::with_capacity(kernel.body.len());
        for (i, ins) in kernel.body.iter().enumerate() {
            let v = eval_instr(kernel, ins, &vals, width, |at| {
                let view = views[i].as_ref().expect("loads and random ops have views");
                match at {
                    Read::Buffer(input, _) => {
                        if row_len == 0 && levels[i] == Level::Row {
                            // An empty row still has its row values (`mean(x, axis=0) * y`
                            // over zero rows of x reads y): the element at the row's kept
                            // index.
                            row_element(&bufs[input], view, kept.len(), r, ins.dtype)
                        } else if row_len == 0 {
                            Vals::fill(Scalar::I(0), ins.dtype, ins.dtype, 0)
                        } else {
                            let offs = Offsets::starting_at(
                                view.shape.dims(),
                                &view.strides,
                                view.offset,
                                first,
                            );
                            bufs[input].gather(offs.take(row_len))
                        }
                    }
                    Read::Gather(..) => {
                        unreachable!("gathers are in element-wise kernels only (Kernel::check)")
                    }
                    Read::Positions(_) => {
                        let offs: Vec<i64> = if row_len == 0 && levels[i] == Level::Row {
                            vec![row_offset(view, kept.len(), r) as i64]
                        } else {
                            Offsets::starting_at(
                                view.shape.dims(),
                                &view.strides,
                                view.offset,
                                first,
                            )
                            .take(row_len)
                            .map(|o| o as i64)
                            .collect()
                        };
                        Vals::I(offs)
                    }
                }
            });
            vals.push(v);
        }
        for (k, st) in kernel.stores.iter().enumerate() {
            let dtype = kernel.outputs[st.output].dtype;
            let v = &vals[st.value.index()];
            // The buffer's length says whether it takes every position or one per row.
            let per_row =
                levels[st.value.index()] == Level::Row && kernel.outputs[st.output].len == rows;
            let positions: Vec<usize> = if per_row {
                vec![r]
            } else {
                Offsets::starting_at(out_view.shape.dims(), &out_view.strides, 0, first)
                    .take(row_len)
                    .collect()
            };
            match (&mut outs[k], v) {
                (Vals::F(o), Vals::F(v)) => positions
                    .iter()
                    .zip(v)
                    .for_each(|(&p, &x)| o[p] = round_f64(x, dtype)),
                (Vals::I(o), Vals::I(v)) => positions
                    .iter()
                    .zip(v)
                    .for_each(|(&p, &x)| o[p] = wrap_int(x, dtype)),
                (Vals::B(o), Vals::B(v)) => positions.iter().zip(v).for_each(|(&p, &x)| o[p] = x),
                _ => panic!("a store of another kind than its buffer passed Kernel::check (a bug)"),
            }
        }
    }
    // Outputs in `kernel.outputs` order (each is stored exactly once).
    let mut by_output: Vec<Option<HostArray>> = vec![None; kernel.outputs.len()];
    for (st, v) in kernel.stores.iter().zip(outs) {
        let b = &kernel.outputs[st.output];
        let shape = Shape::new([b.len]);
        by_output[st.output] = Some(
            Tensor {
                dtype: b.dtype,
                shape,
                vals: v,
            }
            .into_host(),
        );
    }
    by_output
        .into_iter()
        .map(|o| o.expect("every output is stored once (Kernel::check)"))
        .collect()
}
