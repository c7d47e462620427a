//! Element-wise kernels (`Plan::Elementwise`): a grid-stride loop, `V` elements (16
//! bytes) per thread per step when the innermost axis allows it (the vector loop),
//! else one (the scalar loop).

use super::launch::Launch;
use super::source::Gen;
use crate::index::coalesce;
use crate::scalar::{self, Helper};
use ndfuse_ir::{Expr, View};
use std::fmt::Write as _;

impl Gen<'_> {
    pub(super) fn elementwise(&mut self) -> (Vec<Launch>, String) {
        let k = self.k;
        let n = k.domain.numel();
        // Random ops and positions index their own positions through their views as
        // loads index buffers, and a gather's fixed part is a load's offset: all take
        // part in one index space (`input` is unused for random ops and positions).
        let loads: Vec<(usize, usize, &View)> = k
            .body
            .iter()
            .enumerate()
            .filter_map(|(i, ins)| match &ins.expr {
                Expr::Load { input, view } | Expr::Gather { input, view, .. } => {
                    Some((i, *input, view))
                }
                Expr::Random { view, .. } | Expr::Position { view } => Some((i, usize::MAX, view)),
                _ => None,
            })
            .collect();
        let mut views: Vec<Vec<isize>> = loads.iter().map(|(_, _, v)| v.strides.clone()).collect();
        views.push(k.domain.contiguous_strides());
        let space = coalesce(k.domain.dims(), &views);
        let out_v = loads.len();
        let inner = space.dims.last().copied().unwrap_or(1);
        // A random op's key (one i64, read once per step) does not narrow the vectors.
        let keys: Vec<usize> = k
            .body
            .iter()
            .filter_map(|ins| match &ins.expr {
                Expr::Random { key, .. } => match &k.body[key.index()].expr {
                    Expr::Load { input, .. } => Some(*input),
                    _ => None,
                },
                _ => None,
            })
            .collect();
        let widest = k
            .inputs
            .iter()
            .enumerate()
            .filter(|(i, _)| !keys.contains(i))
            .map(|(_, b)| b)
            .chain(&k.outputs)
            .map(|b| b.dtype.size_bytes())
            .max()
            .unwrap_or(4);
        let lanes = (16 / widest.max(1)).max(1);
        let vec4 = lanes > 1 && n >= lanes && inner % lanes == 0 && space.is_row_major(out_v);
        let threads = 256.min(self.opts.max_block_size);
        let name = k.name.clone();
        self.open_function(&name, threads);
        let ind = "  ";
        let _ = writeln!(self.body, "{ind}const nd_idx n = {n};");
        let tid = "(nd_idx)blockIdx.x * blockDim.x + threadIdx.x";
        let stride = "(nd_idx)gridDim.x * blockDim.x";
        let strategy;
        let grid;
        if vec4 {
            self.needs.insert(Helper::Vec4);
            grid = self.grid_for(n / lanes, threads as usize);
            strategy = format!(
                "grid-stride loop, {lanes} elements (16 bytes) per thread per step, {threads} threads per block"
            );
            let _ = writeln!(
                self.body,
                "{ind}for (nd_idx q = {tid}; q < n / {lanes}; q += {stride}) {{"
            );
            let ind2 = "    ";
            let _ = writeln!(self.body, "{ind2}const nd_idx p = q * {lanes};");
            self.body.push_str(&space.decompose("p", "i", ind2));
            // Per load: how lanes read it.
            let mut lane_src: Vec<Option<String>> = vec![None; k.body.len()];
            for (li, &(i, input, view)) in loads.iter().enumerate() {
                if let Expr::Random { key, .. } = &k.body[i].expr {
                    // Lane l's position: the lane's offset along the innermost axis.
                    let inner_stride = space.strides[li].last().copied().unwrap_or(0);
                    let off = space.offset(li, "p", "i", view.offset);
                    let _ = writeln!(self.body, "{ind2}const nd_idx o{i} = {off};");
                    let at = format!("o{i} + l * {inner_stride}");
                    lane_src[i] =
                        Some(scalar::random(&format!("v{}", key.0), &at, &mut self.needs));
                    continue;
                }
                if matches!(k.body[i].expr, Expr::Position { .. } | Expr::Gather { .. }) {
                    // Lane l's offset is the lane's own; a gather adds its indices there.
                    let inner_stride = space.strides[li].last().copied().unwrap_or(0);
                    let off = space.offset(li, "p", "i", view.offset);
                    let _ = writeln!(self.body, "{ind2}const nd_idx o{i} = {off};");
                    let at = match inner_stride {
                        0 => format!("o{i}"),
                        1 => format!("o{i} + l"),
                        s => format!("o{i} + l * {s}"),
                    };
                    lane_src[i] = Some(self.computed_read(i, &at));
                    continue;
                }
                let st = scalar::storage_type(k.inputs[input].dtype);
                let d = k.inputs[input].dtype;
                let inner_stride = space.strides[li].last().copied().unwrap_or(0);
                let off = space.offset(li, "p", "i", view.offset);
                let v = lanes as isize;
                let aligned = view.offset % v == 0
                    && space.strides[li][..space.dims.len().saturating_sub(1)]
                        .iter()
                        .all(|s| s % v == 0);
                if space.is_fixed(li) || inner_stride == 0 {
                    let _ = writeln!(
                        self.body,
                        "{ind2}const {} b{i} = {};",
                        scalar::compute_type(d),
                        self.load_expr(input, &off)
                    );
                    lane_src[i] = Some(format!("b{i}"));
                } else if inner_stride == 1 && aligned {
                    let _ = writeln!(
                        self.body,
                        "{ind2}const nd_vec<{st}, {lanes}> a{i} = *reinterpret_cast<const nd_vec<{st}, {lanes}>*>(in{input} + ({off}));"
                    );
                    lane_src[i] = Some(scalar::load_conv(d, &format!("a{i}.v[l]")));
                } else {
                    let _ = writeln!(self.body, "{ind2}const nd_idx o{i} = {off};");
                    lane_src[i] =
                        Some(self.load_expr(input, &format!("o{i} + l * {inner_stride}")));
                }
            }
            for s in &k.stores {
                let d = k.outputs[s.output].dtype;
                let _ = writeln!(
                    self.body,
                    "{ind2}nd_vec<{}, {lanes}> r{};",
                    scalar::storage_type(d),
                    s.output
                );
            }
            let _ = writeln!(self.body, "{ind2}#pragma unroll");
            let _ = writeln!(self.body, "{ind2}for (int l = 0; l < {lanes}; ++l) {{");
            let ind3 = "      ";
            self.element_body(&lane_src, "r{}.v[l]", ind3);
            let _ = writeln!(self.body, "{ind2}}}");
            for s in &k.stores {
                let st = scalar::storage_type(k.outputs[s.output].dtype);
                let _ = writeln!(
                    self.body,
                    "{ind2}*reinterpret_cast<nd_vec<{st}, {lanes}>*>(out{o} + p) = r{o};",
                    o = s.output
                );
            }
            let _ = writeln!(self.body, "{ind}}}");
        } else {
            grid = self.grid_for(n, threads as usize);
            strategy = format!(
                "grid-stride loop, 1 element per thread per step, {threads} threads per block"
            );
            let _ = writeln!(
                self.body,
                "{ind}for (nd_idx p = {tid}; p < n; p += {stride}) {{"
            );
            let ind2 = "    ";
            self.body.push_str(&space.decompose("p", "i", ind2));
            let mut src: Vec<Option<String>> = vec![None; k.body.len()];
            for (li, &(i, input, view)) in loads.iter().enumerate() {
                let off = space.offset(li, "p", "i", view.offset);
                src[i] = Some(match &k.body[i].expr {
                    Expr::Random { key, .. } => {
                        scalar::random(&format!("v{}", key.0), &off, &mut self.needs)
                    }
                    Expr::Position { .. } | Expr::Gather { .. } => self.computed_read(i, &off),
                    _ => self.load_expr(input, &off),
                });
            }
            self.element_body(&src, "out{}[p]", ind2);
            let _ = writeln!(self.body, "{ind}}}");
        }
        self.body.push_str("}\n");
        let launch = Launch {
            function: name,
            grid,
            block: (threads, 1),
        };
        (if n == 0 { vec![] } else { vec![launch] }, strategy)
    }
}
