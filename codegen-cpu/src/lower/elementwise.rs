//! The loops of element-wise kernels: the flat loop over positions `start..end` (a
//! vector loop first when every load is contiguous or fixed and every op has a vector
//! form, `vector::elementwise_vectors`, then the scalar loop for the rest), and the row
//! loop below for kernels whose loads broadcast.
//!
//! ```text
//! block0(ptrs, start, end):   brif start < end, block1, exit
//! block1:                     buffer pointers from ptrs; loads of fixed elements
//!                             jump entry(start)
//! entry(i):                   the scalar loop from i: one loop dividing each position
//!                             into its index groups, or, when the innermost group is
//!                             16 or more long, row segment by row segment:
//!   row = i / inner; rowend = min(row * inner + inner, end); outer groups of row
//!   loop(p, j = i - row * inner): loads at (outer groups, j), the body, stores
//!                                 brif p + 1 < rowend, loop(p + 1, j + 1), next
//!   next:                         brif rowend < end, entry(rowend), exit
//! exit:                       return
//! ```
//!
//! The row loop of element-wise kernels whose loads broadcast: loads that repeat along
//! the rows of the domain (`b[M]` in `a[N,M] * b[M]`: stride 0 outside, contiguous
//! along the innermost group of axes) or hold one value per row (`c[N,1]`: stride 0
//! along it). The flat positions `start..end` are walked row segment by row segment,
//! the innermost group vectorised with per-row base pointers:
//!
//! ```text
//! rowhead(i):  row = i / M; rowend = min(row*M + M, end)
//!              per load: a base pointer for the row (stride 1 along it), or its one
//!              value for the row, loaded and splatted (stride 0)
//!   vector loop over i..i + (rowend - i) rounded down to the step, two vectors a step
//!   scalar loop over the rest of the segment
//!   brif rowend < end, rowhead(rowend), exit
//! ```
//!
//! Each position computes exactly the ops the flat scalar loop would, on the same
//! elements (vector and scalar code give the same bits: `vmath`), so results are
//! unchanged; only the index arithmetic moves out of the inner loop.

use super::function::{cl_type, input_flags, vector_input_flags, Lowering, Offset};
use super::random;
use super::sweep::Bound;
use super::vector::{elementwise_type, lane_vector, vector_op};
use crate::index::{self, Access, IndexPlan};
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{types, InstBuilder, MemFlagsData, Type, Value};
use cranelift_module::Module;
use ndfuse_ir::{Expr, Kernel, View};

/// Vectors per iteration of the inner loop.
const UNROLL: i64 = 2;

/// How a load reads along the innermost group of axes (the row).
#[derive(Clone, Copy)]
enum Along {
    /// The flat position itself (a contiguous view).
    Flat,
    /// Stride 1 from a per-row base.
    Row,
    /// Stride 0: one value per row.
    Splat,
}

/// The vector type of the row loop of an element-wise kernel, or `None` when it does
/// not apply: the index plan has an outer and an inner group, the inner one at least a
/// step long; every value is a float of one dtype, every op has a vector form, and
/// every load is fixed (`load_access[v]` is `None`), contiguous, or strided with stride
/// 0 or 1 along the inner group.
pub(super) fn row_loop_type(
    kernel: &Kernel,
    plan: &IndexPlan,
    load_access: &[Option<Access>],
) -> Option<Type> {
    let dtype = kernel.body[kernel.stores.first()?.value.index()].dtype;
    let vt = lane_vector(dtype)?;
    let inner = *plan.extents.last()?;
    if plan.extents.len() < 2 || inner < i64::from(vt.lane_count()) * UNROLL {
        return None;
    }
    let inv = row_invariant(kernel, load_access);
    let ok = kernel.body.iter().enumerate().all(|(v, ins)| {
        // Computed once per row as scalars (indices, positions, their arithmetic);
        // a float one is splatted.
        if inv[v] {
            return ins.dtype == dtype || !ins.dtype.is_float();
        }
        let operands_ok = Kernel::operands(&ins.expr)
            .iter()
            .all(|o| !inv[o.index()] || kernel.body[o.index()].dtype == dtype);
        ins.dtype == dtype
            && match &ins.expr {
                Expr::Load { .. } => along(&load_access[v]).is_some() || load_access[v].is_none(),
                // Indices the same along the row: a per-row base pointer.
                Expr::Gather { axes, .. } => {
                    matches!(along(&load_access[v]), Some(Along::Row))
                        && axes.iter().all(|a| inv[a.index.index()])
                }
                Expr::Const(_) => true,
                Expr::Position { .. } => false,
                e => operands_ok && vector_op(kernel, e, dtype),
            }
    });
    ok.then_some(vt)
}

/// Which values are the same at every position of a row (the innermost group): loads
/// and positions with stride 0 along it, constants, fixed loads, and what is computed
/// from those alone (a gather whose indices are such values and whose own stride along
/// the row is 0 included).
fn row_invariant(kernel: &Kernel, load_access: &[Option<Access>]) -> Vec<bool> {
    let mut inv = vec![false; kernel.body.len()];
    for (v, ins) in kernel.body.iter().enumerate() {
        let operands = Kernel::operands(&ins.expr);
        inv[v] = match &ins.expr {
            Expr::Const(_) => true,
            Expr::Load { .. } | Expr::Position { .. } => {
                load_access[v].is_none() || matches!(along(&load_access[v]), Some(Along::Splat))
            }
            Expr::Gather { .. } => {
                matches!(along(&load_access[v]), Some(Along::Splat))
                    && operands.iter().all(|o| inv[o.index()])
            }
            Expr::Unary(..) | Expr::Binary(..) | Expr::Where(..) | Expr::Cast(_) => {
                operands.iter().all(|o| inv[o.index()])
            }
            Expr::Reduce(..) | Expr::ArgReduce(..) | Expr::Random { .. } => false,
        };
    }
    inv
}

/// A strided access without its inner group: where a row starts. Positions and gathers
/// of the row loop always have one (`row_loop_type`, `row_invariant`).
fn outer_access(access: &Option<Access>) -> Access {
    let Some(Access::Strided { offset, strides }) = access else {
        unreachable!("a position or gather of the row loop has a strided access")
    };
    Access::Strided {
        offset: *offset,
        strides: strides[..strides.len() - 1].to_vec(),
    }
}

/// How `access` reads along the inner group, if the row loop can take it.
fn along(access: &Option<Access>) -> Option<Along> {
    match access {
        Some(Access::Contiguous) => Some(Along::Flat),
        Some(Access::Strided { strides, .. }) => match strides.last() {
            Some(1) => Some(Along::Row),
            Some(0) => Some(Along::Splat),
            _ => None,
        },
        _ => None,
    }
}

impl<M: Module> Lowering<'_, '_, M> {
    /// The function of an element-wise kernel over positions `start..end`: the row
    /// loop where loads broadcast (`row_loop_type`), else vectors first where the kernel
    /// allows (`vector::elementwise_vectors`) and the scalar loop for the rest.
    pub(super) fn elementwise_kernel(
        &mut self,
        kernel: &Kernel,
        (ptrs, start, end): (Value, Value, Value),
    ) -> Result<(), String> {
        // An empty domain has no element to read; its views need not even be
        // decomposable, so emit no loop at all.
        if kernel.domain.numel() == 0 {
            self.b.ins().return_(&[]);
            return Ok(());
        }

        let preheader = self.b.create_block();
        let exit = self.b.create_block();

        let nonempty = self.b.ins().icmp(IntCC::SignedLessThan, start, end);
        self.b.ins().brif(nonempty, preheader, &[], exit, &[]);

        // Preheader: everything that does not depend on the position.
        self.b.switch_to_block(preheader);
        let bases = self.buffer_bases(kernel, ptrs);
        let (in_bases, out_bases) = bases.split_at(kernel.inputs.len());

        // A random op's view maps positions to its own row-major indices as a load's
        // maps them to offsets: both take part in the one index plan.
        let views: Vec<&View> = kernel
            .body
            .iter()
            .filter_map(|ins| match &ins.expr {
                Expr::Load { view, .. }
                | Expr::Random { view, .. }
                | Expr::Position { view }
                | Expr::Gather { view, .. } => Some(view),
                _ => None,
            })
            .collect();
        let (plan, accesses) = index::plan(&kernel.domain, &views);
        let mut accesses = accesses.into_iter();

        // Loads of one fixed element (broadcast scalars) are loop-invariant; in bounds
        // whenever the loop runs, since the domain is not empty.
        let mut values: Vec<Option<Value>> = vec![None; kernel.body.len()];
        let mut load_access: Vec<Option<Access>> = vec![None; kernel.body.len()];
        for (v, ins) in kernel.body.iter().enumerate() {
            if let Expr::Load { input, .. } = &ins.expr {
                let access = accesses.next().expect("one access per load");
                if let Access::Fixed(elems) = access {
                    let off = Offset { var: None, elems };
                    values[v] = Some(self.load_at(in_bases[*input], off, ins.dtype));
                } else {
                    load_access[v] = Some(access);
                }
            } else if let Expr::Random { .. } | Expr::Position { .. } | Expr::Gather { .. } =
                &ins.expr
            {
                // Computed at every position, even from a fixed part (a gather's
                // index varies).
                load_access[v] = Some(accesses.next().expect("one access per view"));
            }
        }
        // The key schedule of each random op whose key is loop-invariant (a fixed load)
        // and whose positions are all below 2^32: computed once, here.
        let mut streams: Vec<Option<Value>> = vec![None; kernel.body.len()];
        for (v, ins) in kernel.body.iter().enumerate() {
            if let Expr::Random { key, view } = &ins.expr {
                if let (Some(k), true) = (values[key.index()], random::below_2_32(view)) {
                    streams[v] = Some(self.random_stream(k, None));
                }
            }
        }
        // Loads that broadcast along rows or per row: the row loop does every position.
        if elementwise_type(kernel, &plan, &load_access).is_none() {
            if let Some(vt) = row_loop_type(kernel, &plan, &load_access) {
                let loads = (&plan, &load_access[..]);
                let bases = (in_bases, out_bases);
                self.elementwise_rows(kernel, (start, end, exit), loads, &values, vt, bases)?;
                self.b.switch_to_block(exit);
                self.b.ins().return_(&[]);
                return Ok(());
            }
        }
        // Vectors first where the kernel allows, then scalars for the rest: row segment
        // by row segment where the innermost group is long (the index groups outside
        // it divided out once per segment, not at every position: a convolution's
        // window gather spent most of its time in those divisions), else one loop
        // that divides each position.
        let inner = plan.extents.last().copied().unwrap_or(1);
        let segmented = plan.extents.len() > 1 && plan.outermost_needed().is_some() && inner >= 16;
        let entry = self.b.create_block();
        let from = self.b.append_block_param(entry, types::I64);
        match elementwise_type(kernel, &plan, &load_access) {
            Some(vt) => {
                let bases = (in_bases, out_bases);
                let loads = (&plan, &load_access[..]);
                let vend =
                    self.elementwise_vectors(kernel, (start, end), loads, &values, vt, bases)?;
                let more = self.b.ins().icmp(IntCC::SignedLessThan, vend, end);
                self.b.ins().brif(more, entry, &[vend.into()], exit, &[]);
            }
            None => {
                self.b.ins().jump(entry, &[start.into()]);
            }
        }
        let env = ScalarEnv {
            values: &values,
            load_access: &load_access,
            streams: &streams,
            in_bases,
            out_bases,
        };
        self.b.switch_to_block(entry);
        if segmented {
            // rowhead(i): the segment i..rowend of row i / inner, its outer indices.
            let (consts, scaled) = (self.consts.clone(), self.scaled.clone());
            let m = self.iconst(inner);
            let row = self.b.ins().udiv(from, m);
            let row_start = self.b.ins().imul(row, m);
            let row_next = self.b.ins().iadd(row_start, m);
            let row_end = self.b.ins().smin(row_next, end);
            let j0 = self.b.ins().isub(from, row_start);
            let outer = IndexPlan {
                extents: plan.extents[..plan.extents.len() - 1].to_vec(),
                needed: plan.needed[..plan.needed.len() - 1].to_vec(),
            };
            let mut indices = self.decompose(&outer, row);
            let carried = [(types::I64, j0)];
            self.counted_loop(
                from,
                Bound::Value(row_end),
                1,
                false,
                &carried,
                |lw, i, j| {
                    indices.push(Some(j[0]));
                    lw.scalar_position(kernel, &env, &indices, i)?;
                    indices.pop();
                    Ok(vec![lw.b.ins().iadd_imm_s(j[0], 1)])
                },
            )?;
            let more = self.b.ins().icmp(IntCC::SignedLessThan, row_end, end);
            self.b.ins().brif(more, entry, &[row_end.into()], exit, &[]);
            (self.consts, self.scaled) = (consts, scaled);
        } else {
            self.counted_loop(from, Bound::Value(end), 1, false, &[], |lw, i, _| {
                let indices = lw.decompose(&plan, i);
                lw.scalar_position(kernel, &env, &indices, i)?;
                Ok(Vec::new())
            })?;
            self.b.ins().jump(exit, &[]);
        }

        self.b.switch_to_block(exit);
        self.b.ins().return_(&[]);
        Ok(())
    }

    /// The kernel's body at position `i` of the flat scalar loop (`indices`: its index
    /// groups), storing every output.
    fn scalar_position(
        &mut self,
        kernel: &Kernel,
        env: &ScalarEnv<'_>,
        indices: &[Option<Value>],
        i: Value,
    ) -> Result<(), String> {
        let mut values = env.values.to_vec();
        for (v, ins) in kernel.body.iter().enumerate() {
            if values[v].is_some() {
                continue;
            }
            let value = match &ins.expr {
                Expr::Load { input, .. } => {
                    let access = env.load_access[v]
                        .as_ref()
                        .expect("a load's access was planned");
                    let off = self.element_offset(access, indices, i);
                    self.load_at(env.in_bases[*input], off, ins.dtype)
                }
                Expr::Random { key, view } => {
                    let access = env.load_access[v]
                        .as_ref()
                        .expect("a random op's access was planned");
                    let off = self.element_offset(access, indices, i);
                    let index = match off.var {
                        Some(var) if off.elems == 0 => var,
                        Some(var) => self.b.ins().iadd_imm_s(var, off.elems),
                        None => self.iconst(off.elems),
                    };
                    let key = values[key.index()].expect("SSA order: the key comes first");
                    let stream = match env.streams[v] {
                        Some(h) => Some(h),
                        None if random::below_2_32(view) => Some(self.random_stream(key, None)),
                        None => None,
                    };
                    self.random_at(key, index, stream)
                }
                Expr::Position { .. } => {
                    let access = env.load_access[v]
                        .as_ref()
                        .expect("a position's access was planned");
                    let off = self.element_offset(access, indices, i);
                    match off.var {
                        Some(var) if off.elems == 0 => var,
                        Some(var) => self.b.ins().iadd_imm_s(var, off.elems),
                        None => self.iconst(off.elems),
                    }
                }
                Expr::Gather { input, axes, .. } => {
                    let access = env.load_access[v]
                        .as_ref()
                        .expect("a gather's access was planned");
                    let off = self.element_offset(access, indices, i);
                    let off = self.gather_offset(kernel, off, axes, &values);
                    self.load_at(env.in_bases[*input], off, ins.dtype)
                }
                _ => self.compute(kernel, v, &values)?,
            };
            values[v] = Some(value);
        }
        for s in &kernel.stores {
            let value = values[s.value.index()].expect("stored values are defined");
            let dtype = kernel.body[s.value.index()].dtype;
            let at = Offset {
                var: Some(i),
                elems: 0,
            };
            let (addr, imm) = self.address(env.out_bases[s.output], at, dtype);
            self.store_typed(dtype, MemFlagsData::trusted(), value, addr, imm);
        }
        Ok(())
    }

    /// `off` plus each gather axis's clamped index times its stride.
    fn gather_offset(
        &mut self,
        kernel: &Kernel,
        mut off: Offset,
        axes: &[ndfuse_ir::GatherAxis],
        values: &[Option<Value>],
    ) -> Offset {
        for a in axes {
            let k = values[a.index.index()].expect("SSA order: the index comes first");
            let k = self.clamped_index(k, kernel.body[a.index.index()].dtype, a.extent);
            let term = match a.stride {
                1 => k,
                s => {
                    let s = self.iconst(s as i64);
                    self.b.ins().imul(k, s)
                }
            };
            off.var = Some(match off.var {
                None => term,
                Some(acc) => self.b.ins().iadd(acc, term),
            });
        }
        off
    }

    /// A gather's index `k` (an i32 or i64 value) as an i64 position in `0..extent`: plus
    /// `extent` when negative, then clamped (a user's index was checked before the
    /// kernel ran; a computed one may be anywhere, and must never read outside).
    fn clamped_index(&mut self, k: Value, dtype: ndfuse_ir::DType, extent: usize) -> Value {
        let k = if dtype == ndfuse_ir::DType::I32 {
            self.b.ins().sextend(types::I64, k)
        } else {
            k
        };
        let n = self.iconst(extent as i64);
        let zero = self.iconst(0);
        let last = self.iconst(extent as i64 - 1);
        let negative = self.b.ins().icmp(IntCC::SignedLessThan, k, zero);
        let wrapped = self.b.ins().iadd(k, n);
        let k = self.b.ins().select(negative, wrapped, k);
        let k = self.b.ins().smax(k, zero);
        self.b.ins().smin(k, last)
    }

    /// The row loop over positions `[start, end)` (`start < end`), ending in a jump to
    /// `exit`. `fixed` holds the values of fixed loads (made before the loop).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn elementwise_rows(
        &mut self,
        kernel: &Kernel,
        (start, end, exit): (Value, Value, cranelift_codegen::ir::Block),
        (plan, load_access): (&IndexPlan, &[Option<Access>]),
        fixed: &[Option<Value>],
        vt: Type,
        (in_bases, out_bases): (&[Value], &[Value]),
    ) -> Result<(), String> {
        let width = i64::from(vt.lane_count());
        let step = width * UNROLL;
        let inner = *plan
            .extents
            .last()
            .expect("two groups at least (row_loop_type)");
        let outer = IndexPlan {
            extents: plan.extents[..plan.extents.len() - 1].to_vec(),
            needed: plan.needed[..plan.needed.len() - 1].to_vec(),
        };
        // Loop invariants: constants and fixed loads, as scalars and as vectors.
        let mut scalars: Vec<Option<Value>> = vec![None; kernel.body.len()];
        for (v, ins) in kernel.body.iter().enumerate() {
            scalars[v] = match (&ins.expr, fixed[v]) {
                (Expr::Load { .. }, Some(x)) => Some(x),
                (Expr::Const(_), _) => Some(self.compute(kernel, v, &scalars)?),
                _ => None,
            };
        }
        let lane_dtype = kernel.body[kernel.stores[0].value.index()].dtype;
        let mut vectors = scalars.clone();
        for (v, x) in vectors.iter_mut().enumerate() {
            *x = match *x {
                Some(s) if kernel.body[v].dtype == lane_dtype => Some(self.b.ins().splat(vt, s)),
                _ => None,
            };
        }
        let (consts, scaled) = (self.consts.clone(), self.scaled.clone());
        let head = self.b.create_block();
        let i = self.b.append_block_param(head, types::I64);
        self.b.ins().jump(head, &[start.into()]);

        // One row segment: i .. rowend.
        self.b.switch_to_block(head);
        let m = self.iconst(inner);
        let row = self.b.ins().udiv(i, m);
        let row_start = self.b.ins().imul(row, m);
        let row_next = self.b.ins().iadd(row_start, m);
        let row_end = self.b.ins().smin(row_next, end);
        let idx = self.decompose(&outer, row);
        // Per load: a base pointer with the row's offset folded in (minus row_start, so
        // that the position itself indexes it), or the row's one value.
        let mut bases: Vec<Option<Value>> = vec![None; kernel.body.len()];
        // A gather's constant offset (its base pointer's immediate).
        let mut gather_elems: Vec<i64> = vec![0; kernel.body.len()];
        let mut row_scalars = scalars.clone();
        let mut row_vectors = vectors.clone();
        for (v, ins) in kernel.body.iter().enumerate() {
            let Expr::Load { input, .. } = &ins.expr else {
                continue;
            };
            let (Some(kind), Some(Access::Strided { offset, strides })) =
                (along(&load_access[v]), &load_access[v])
            else {
                continue;
            };
            let outer_access = Access::Strided {
                offset: *offset,
                strides: strides[..strides.len() - 1].to_vec(),
            };
            let off = self.element_offset(&outer_access, &idx, row);
            match kind {
                Along::Splat => {
                    let x = self.load_at(in_bases[*input], off, ins.dtype);
                    row_scalars[v] = Some(x);
                    row_vectors[v] = (ins.dtype == lane_dtype).then(|| self.b.ins().splat(vt, x));
                }
                Along::Row => {
                    let var = match off.var {
                        Some(o) => self.b.ins().isub(o, row_start),
                        None => self.b.ins().ineg(row_start),
                    };
                    let shift = self.iconst(i64::from(ins.dtype.size_bytes().trailing_zeros()));
                    let bytes = self.b.ins().ishl(var, shift);
                    let at = self.b.ins().iadd(in_bases[*input], bytes);
                    // The constant offset stays in the immediate of each load.
                    bases[v] = Some(at);
                    row_scalars[v] = None;
                    debug_assert!(off.elems == *offset);
                }
                Along::Flat => {}
            }
        }
        // The rest of the row's invariant values, as scalars (splatted when of the
        // lanes' dtype); then each gather's base pointer for the row.
        let inv = row_invariant(kernel, load_access);
        for (v, ins) in kernel.body.iter().enumerate() {
            if !inv[v] || row_scalars[v].is_some() || matches!(ins.expr, Expr::Load { .. }) {
                continue;
            }
            let x = match &ins.expr {
                Expr::Position { .. } | Expr::Gather { .. } => {
                    let outer = outer_access(&load_access[v]);
                    let off = self.element_offset(&outer, &idx, row);
                    match &ins.expr {
                        Expr::Gather { input, axes, .. } => {
                            let off = self.gather_offset(kernel, off, axes, &row_scalars);
                            self.load_at(in_bases[*input], off, ins.dtype)
                        }
                        _ => match off.var {
                            Some(var) => self.b.ins().iadd_imm_s(var, off.elems),
                            None => self.iconst(off.elems),
                        },
                    }
                }
                _ => self.compute(kernel, v, &row_scalars)?,
            };
            row_scalars[v] = Some(x);
            row_vectors[v] = (ins.dtype == lane_dtype).then(|| self.b.ins().splat(vt, x));
        }
        for (v, ins) in kernel.body.iter().enumerate() {
            let Expr::Gather { input, axes, .. } = &ins.expr else {
                continue;
            };
            if inv[v] {
                continue;
            }
            let outer = outer_access(&load_access[v]);
            let off = self.element_offset(&outer, &idx, row);
            let off = self.gather_offset(kernel, off, axes, &row_scalars);
            // As a load with stride 1 along the row: minus row_start, so that the
            // position itself indexes it; the constant part stays in the immediate.
            let var = match off.var {
                Some(o) => self.b.ins().isub(o, row_start),
                None => self.b.ins().ineg(row_start),
            };
            let shift = self.iconst(i64::from(ins.dtype.size_bytes().trailing_zeros()));
            let bytes = self.b.ins().ishl(var, shift);
            bases[v] = Some(self.b.ins().iadd(in_bases[*input], bytes));
            gather_elems[v] = off.elems;
            row_scalars[v] = None;
        }
        let len = self.b.ins().isub(row_end, i);
        let vlen = self.b.ins().band_imm_s(len, -step);
        let vend = self.b.ins().iadd(i, vlen);
        let env = RowEnv {
            load_access,
            invariant: &inv,
            gather_elems: &gather_elems,
            bases: &bases,
            in_bases,
            out_bases,
        };
        self.counted_loop(i, Bound::Value(vend), step, true, &[], |lw, p, _| {
            for u in 0..UNROLL {
                lw.row_position(kernel, &env, (p, u * width), &row_vectors, Some(vt))?;
            }
            Ok(Vec::new())
        })?;
        self.counted_loop(vend, Bound::Value(row_end), 1, true, &[], |lw, p, _| {
            lw.row_position(kernel, &env, (p, 0), &row_scalars, None)?;
            Ok(Vec::new())
        })?;
        let more = self.b.ins().icmp(IntCC::SignedLessThan, row_end, end);
        self.b.ins().brif(more, head, &[row_end.into()], exit, &[]);
        (self.consts, self.scaled) = (consts, scaled);
        Ok(())
    }

    /// The kernel's body at position `p + lane` of a row segment, on vectors of `vt`
    /// (the `W` positions from there) or, for `None`, on scalars; `invariant` holds the
    /// values of constants and fixed and per-row loads in that form.
    fn row_position(
        &mut self,
        kernel: &Kernel,
        env: &RowEnv<'_>,
        (p, lane): (Value, i64),
        invariant: &[Option<Value>],
        vt: Option<Type>,
    ) -> Result<(), String> {
        let mut vals = invariant.to_vec();
        for (v, ins) in kernel.body.iter().enumerate() {
            if vals[v].is_some() || env.invariant[v] {
                continue;
            }
            let value = match &ins.expr {
                Expr::Load { input, .. } | Expr::Gather { input, .. } => {
                    let (base, elems) = match (&ins.expr, &env.load_access[v], env.bases[v]) {
                        (Expr::Gather { .. }, _, Some(b)) => (b, env.gather_elems[v]),
                        (_, Some(Access::Strided { offset, .. }), Some(b)) => (b, *offset),
                        _ => (env.in_bases[*input], 0),
                    };
                    let off = Offset {
                        var: Some(p),
                        elems: elems + lane,
                    };
                    let (addr, imm) = self.address(base, off, ins.dtype);
                    match vt {
                        Some(vt) => {
                            let flags = vector_input_flags();
                            self.load_typed(ins.dtype, vt, flags, addr, imm)
                        }
                        None => {
                            let flags = input_flags();
                            self.load_typed(ins.dtype, cl_type(ins.dtype), flags, addr, imm)
                        }
                    }
                }
                _ => self.compute(kernel, v, &vals)?,
            };
            vals[v] = Some(value);
        }
        for st in &kernel.stores {
            let value = vals[st.value.index()].expect("stored values are computed");
            let dtype = kernel.body[st.value.index()].dtype;
            let at = Offset {
                var: Some(p),
                elems: lane,
            };
            let (addr, imm) = self.address(env.out_bases[st.output], at, dtype);
            // Vectors are element-aligned only, like the loads.
            let flags = match vt {
                Some(_) => MemFlagsData::new().with_notrap(),
                None => MemFlagsData::trusted(),
            };
            self.store_typed(dtype, flags, value, addr, imm);
        }
        Ok(())
    }
}

/// What every position of the flat scalar loop reads: the values of fixed loads, each
/// view's planned access, the key schedules made once, the buffers' base pointers.
struct ScalarEnv<'a> {
    values: &'a [Option<Value>],
    load_access: &'a [Option<Access>],
    streams: &'a [Option<Value>],
    in_bases: &'a [Value],
    out_bases: &'a [Value],
}

/// What every position of a row segment reads.
struct RowEnv<'a> {
    load_access: &'a [Option<Access>],
    /// Which values are the same along the row (`row_invariant`): computed at the
    /// row's head; those not of the lanes' dtype (indices) have no vector form.
    invariant: &'a [bool],
    /// Per gather: the constant part of its offset.
    gather_elems: &'a [i64],
    /// Per load (or gather) with stride 1 along the row: its base pointer for the row.
    bases: &'a [Option<Value>],
    in_bases: &'a [Value],
    out_bases: &'a [Value],
}
