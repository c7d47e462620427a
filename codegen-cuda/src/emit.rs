//! Kernel descriptions to CUDA C: one source text per kernel, one or more `__global__`
//! functions in it, and the launches that run them in order.
//!
//! ## Element-wise kernels (`Plan::Elementwise`)
//!
//! A grid-stride loop over the domain. Each iteration takes `V` consecutive positions,
//! `V` = 16 bytes over the widest buffer element (4 for f32, 8 when every buffer is
//! f16/bf16, 2 for f64), when the innermost (merged) axis holds a multiple of `V`:
//! loads that move along that axis with unit stride and `V`-aligned offsets become one
//! aligned 16-byte access (`nd_vec<float, 4>` is an `ld.global.v4.f32`, `nd_vec<__half,
//! 8>` one `ld.global.v4.b32`), loads that stay put are read once, others are gathered
//! lane by lane; stores are `V`-element accesses too. Otherwise one position per
//! iteration.
//!
//! ## Kernels with reductions: the row program on a group of threads
//!
//! A row (a TAD) is reduced by a *group* of `G` threads: lane `l` of the group takes
//! elements `l, l + G, ...`, accumulating a partial per reduction, and the group combines
//! the partials in a fixed tree (so a result depends on the launch shape, which depends
//! only on the kernel's shapes, never on timing: deterministic, no atomics). The
//! strategies, chosen from the plan and the row length:
//!
//! | strategy | when | group | combine |
//! |---|---|---|---|
//! | thread per row | rows shorter than 32 | 1 thread | none |
//! | warp per row | rows of 32..=512, or up to 1024 read in one pass | a warp (8 rows per block) | `__shfl_xor_sync` butterfly |
//! | block per row | longer rows | a block | warp shuffles, then the warps' partials in order through shared memory |
//! | column tile | `Plan::Columns`, and strided rows whose innermost kept axis is contiguous | 8 threads of a 32 x 8 block, 32 rows side by side | through a shared-memory tile |
//! | split | `Plan::Split` (few long rows) | see below | partials in a scratch buffer |
//!
//! A row program may need several sweeps over its row (softmax: max, then the sum of
//! `exp(x - max)`, then the stores). When a lane's share of a row is at most 16 elements
//! per load, the first sweep keeps every element it loads in registers and the later
//! sweeps read them from there (one pass over global memory); otherwise every sweep reads
//! the row again (two or more passes).
//!
//! ## Split reductions
//!
//! For `Plan::Split { rows, splits, .. }` the launches are, per sweep `s`:
//! `NAME_p{s}` (one block per chunk: the chunk's partials into the scratch buffer) and
//! `NAME_f{s}` (one thread per row: the partials combined in chunk order, the row's
//! results into the scratch buffer, per-row stores after the last sweep), then `NAME_st`
//! if the kernel stores element values. Later launches recompute row values from the
//! results in the scratch buffer. No atomics, so the result is the same on every run.

use crate::index::{coalesce, Space};
use crate::scalar::{self, Helper};
use crate::CudaError;
use ndfuse_ir::{ArgReduceOp, Expr, Kernel, Level, Plan, Shape, View};
use std::collections::BTreeSet;
use std::fmt::Write as _;

/// Limits the emitted launches respect (the runtime's `max_block_size` and
/// `max_grid_size` configuration keys).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CudaOptions {
    /// Most threads per block (rounded down to a power of two, at least 32).
    pub max_block_size: u32,
    /// Most blocks per launch (grid-stride loops cover the rest).
    pub max_grid_size: u32,
}

impl Default for CudaOptions {
    /// ND4J's defaults: 256 threads, 4096 blocks.
    fn default() -> CudaOptions {
        CudaOptions {
            max_block_size: 256,
            max_grid_size: 4096,
        }
    }
}

/// One kernel launch: which function, and its shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Launch {
    /// The `extern "C" __global__` function's name.
    pub function: String,
    /// Blocks (x only: every grid here is one-dimensional).
    pub grid: u32,
    /// Threads per block (x, y).
    pub block: (u32, u32),
}

/// A kernel as CUDA C: the source, and the launches that run it, in order. Every
/// function takes the kernel's input pointers, then its output pointers, then (when
/// `scratch_bytes > 0`) a scratch buffer of that many bytes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CudaKernel {
    /// The kernel's name (`k2_mul_add_exp_sum`).
    pub name: String,
    /// The whole translation unit: includes, helpers, functions.
    pub source: String,
    /// Launches in order.
    pub launches: Vec<Launch>,
    /// Bytes of scratch memory the launches share (split reductions' partials).
    pub scratch_bytes: usize,
    /// How the work is laid out, for dumps (`"block per row, 256 threads, row in registers"`).
    pub strategy: String,
    /// Whether any buffer or value is f16/bf16 (so NVRTC needs the CUDA headers).
    pub uses_half: bool,
}

/// Renders `kernel` as CUDA C. The text depends only on the kernel and `opts`.
pub fn emit(kernel: &Kernel, opts: &CudaOptions) -> Result<CudaKernel, CudaError> {
    kernel.check().map_err(|problems| CudaError::Invalid {
        kernel: kernel.name.clone(),
        problems: problems.join("; "),
    })?;
    let mut g = Gen::new(kernel, opts);
    let (launches, strategy) = if kernel.reduce_axes.is_empty() {
        g.elementwise()
    } else {
        g.row_program()
    };
    Ok(g.finish(launches, strategy))
}

// ---------------------------------------------------------------------------------------

/// How a group of threads is laid out over rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Strategy {
    Thread,
    Warp,
    Block(u32),
    ColumnTile,
}

const TILE_X: u32 = 32;
/// Threads down each column of a tile at most (a 32 x 8 block of 256 threads), fewer
/// when `max_block_size` is smaller.
const TILE_Y: u32 = 8;
/// Most elements per load a lane keeps in registers between sweeps.
const MAX_CACHED: usize = 16;

struct Gen<'k> {
    k: &'k Kernel,
    opts: CudaOptions,
    needs: BTreeSet<Helper>,
    levels: Vec<Level>,
    /// Per instruction: 0 if it needs no reduction result, else one more than the
    /// sweep of the latest reduction it depends on (a reduction runs in sweep
    /// `stage - 1`).
    stage: Vec<usize>,
    sweeps: usize,
    body: String,
    /// Index type: `int` when every position and offset fits, else `long long`.
    wide: bool,
}

/// Where a kernel function gets the results of reductions of earlier sweeps.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Results {
    /// Computed earlier in the same function (variables `v{i}`).
    Local,
    /// Read from the scratch buffer (split launches), row `ra`.
    Scratch,
}

impl<'k> Gen<'k> {
    fn new(k: &'k Kernel, opts: &CudaOptions) -> Gen<'k> {
        let (stage, sweeps) = k.stages();
        let limit = (i32::MAX / 2) as usize;
        let wide =
            k.domain.numel() > limit || k.inputs.iter().chain(&k.outputs).any(|b| b.len > limit);
        let mut opts = *opts;
        opts.max_block_size = pow2_floor(opts.max_block_size.clamp(32, 1024));
        opts.max_grid_size = opts.max_grid_size.max(1);
        Gen {
            k,
            opts,
            needs: BTreeSet::new(),
            levels: k.levels(),
            stage,
            sweeps,
            body: String::new(),
            wide,
        }
    }

    fn finish(self, launches: Vec<Launch>, strategy: String) -> CudaKernel {
        let k = self.k;
        let uses_half = k
            .inputs
            .iter()
            .chain(&k.outputs)
            .map(|b| b.dtype)
            .chain(k.body.iter().map(|i| i.dtype))
            .any(scalar::is_half);
        let mut src = String::new();
        let _ = writeln!(
            src,
            "// ndfuse kernel {}: domain {}{}, plan {}",
            k.name,
            k.domain,
            if k.reduce_axes.is_empty() {
                String::new()
            } else {
                format!(" reducing axes {:?}", k.reduce_axes)
            },
            k.plan
        );
        let _ = writeln!(src, "// {strategy}");
        if uses_half {
            src.push_str("#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n");
        }
        let _ = writeln!(
            src,
            "typedef {} nd_idx;",
            if self.wide { "long long" } else { "int" }
        );
        src.push_str(&scalar::helper_source(&self.needs));
        src.push_str(&self.body);
        let scratch_bytes = self.scratch_layout().1;
        CudaKernel {
            name: k.name.clone(),
            source: src,
            launches,
            scratch_bytes,
            strategy,
            uses_half,
        }
    }

    /// `extern "C" __global__ void NAME(params) {` with launch bounds.
    fn open_function(&mut self, name: &str, threads: u32) {
        let k = self.k;
        let mut params: Vec<String> = k
            .inputs
            .iter()
            .enumerate()
            .map(|(i, b)| {
                format!(
                    "const {}* __restrict__ in{i}",
                    scalar::storage_type(b.dtype)
                )
            })
            .collect();
        params.extend(
            k.outputs
                .iter()
                .enumerate()
                .map(|(i, b)| format!("{}* __restrict__ out{i}", scalar::storage_type(b.dtype))),
        );
        if self.scratch_layout().1 > 0 {
            params.push("unsigned char* __restrict__ scratch".into());
        }
        let _ = writeln!(
            self.body,
            "\nextern \"C\" __global__ void __launch_bounds__({threads}) {name}({}) {{",
            params.join(", ")
        );
    }

    fn grid_for(&self, work_items: usize, per_block: usize) -> u32 {
        let blocks = work_items.div_ceil(per_block.max(1)).max(1);
        blocks.min(self.opts.max_grid_size as usize) as u32
    }

    // -----------------------------------------------------------------------------------
    // Values

    /// The C expression of instruction `i` (not a load, not a reduction), with operands
    /// named `v{n}` (or `v{n}[l]`-style through `name`).
    fn value_expr(&mut self, i: usize, name: &dyn Fn(usize) -> String) -> String {
        let ins = &self.k.body[i];
        let dt = |v: ndfuse_ir::ValueId| self.k.body[v.index()].dtype;
        match &ins.expr {
            Expr::Const(c) => scalar::literal(*c, ins.dtype),
            Expr::Unary(op, a) => {
                scalar::unary(*op, dt(*a), ins.dtype, &name(a.index()), &mut self.needs)
            }
            Expr::Binary(op, a, b) => scalar::binary(
                *op,
                dt(*a),
                &name(a.index()),
                &name(b.index()),
                &mut self.needs,
            ),
            Expr::Where(c, a, b) => format!(
                "({} ? {} : {})",
                name(c.index()),
                name(a.index()),
                name(b.index())
            ),
            Expr::Cast(a) => scalar::cast(dt(*a), ins.dtype, &name(a.index()), &mut self.needs),
            Expr::Load { .. } | Expr::Reduce(..) | Expr::ArgReduce(..) => {
                unreachable!("loads and reductions are emitted by the plan code")
            }
        }
    }

    /// `const T v{i} = expr;`
    fn define(&mut self, i: usize, ind: &str) {
        let e = self.value_expr(i, &|n| format!("v{n}"));
        let t = scalar::compute_type(self.k.body[i].dtype);
        let _ = writeln!(self.body, "{ind}const {t} v{i} = {e};");
    }

    fn load_expr(&self, input: usize, offset: &str) -> String {
        scalar::load_conv(self.k.inputs[input].dtype, &format!("in{input}[{offset}]"))
    }

    // -----------------------------------------------------------------------------------
    // Element-wise

    fn elementwise(&mut self) -> (Vec<Launch>, String) {
        let k = self.k;
        let n = k.domain.numel();
        let loads: Vec<(usize, usize, &View)> = k
            .body
            .iter()
            .enumerate()
            .filter_map(|(i, ins)| match &ins.expr {
                Expr::Load { input, view } => Some((i, *input, view)),
                _ => None,
            })
            .collect();
        let mut views: Vec<Vec<isize>> = loads.iter().map(|(_, _, v)| v.strides.clone()).collect();
        views.push(k.domain.contiguous_strides());
        let space = coalesce(k.domain.dims(), &views);
        let out_v = loads.len();
        let inner = space.dims.last().copied().unwrap_or(1);
        let widest = k
            .inputs
            .iter()
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
                src[i] = Some(self.load_expr(input, &off));
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

    /// One position of an element-wise body: each load from its expression in
    /// `load_src`, the other values computed, then every store into `target` (with `{}`
    /// standing for the output's number).
    fn element_body(&mut self, load_src: &[Option<String>], target: &str, ind: &str) {
        for (i, src) in load_src.iter().enumerate() {
            match src {
                Some(src) => {
                    let t = scalar::compute_type(self.k.body[i].dtype);
                    let _ = writeln!(self.body, "{ind}const {t} v{i} = {src};");
                }
                None => self.define(i, ind),
            }
        }
        for s in &self.k.stores {
            let d = self.k.outputs[s.output].dtype;
            let _ = writeln!(
                self.body,
                "{ind}{} = {};",
                target.replace("{}", &s.output.to_string()),
                scalar::store_conv(d, &format!("v{}", s.value.0))
            );
        }
    }

    // -----------------------------------------------------------------------------------
    // Row programs

    fn strategy(&self) -> Strategy {
        let k = self.k;
        let row_len = k.row_len();
        let innermost_kept = !k.reduce_axes.contains(&(k.domain.rank() - 1));
        let column_like = matches!(k.plan, Plan::Columns { .. })
            || (matches!(
                k.plan,
                Plan::Rows {
                    contiguous: false,
                    ..
                }
            ) && innermost_kept);
        let single_pass = self.sweeps + usize::from(self.has_element_stores()) <= 1;
        if column_like {
            Strategy::ColumnTile
        } else if row_len < 32 {
            Strategy::Thread
        } else if row_len <= 32 * MAX_CACHED || (row_len <= 1024 && single_pass) {
            // A warp keeps up to 16 elements a lane in registers: longer rows that need
            // several passes go to a block, which keeps them there too.
            Strategy::Warp
        } else {
            let want = pow2_ceil(row_len.div_ceil(MAX_CACHED) as u32).max(128);
            Strategy::Block(want.min(self.opts.max_block_size))
        }
    }

    fn row_program(&mut self) -> (Vec<Launch>, String) {
        if let Plan::Split { splits, .. } = self.k.plan {
            return self.split_program(splits.max(1));
        }
        let k = self.k;
        let rows = k.rows();
        let strat = self.strategy();
        let (group, threads_x, threads_y, rows_per_block) = match strat {
            Strategy::Thread => (
                1,
                256.min(self.opts.max_block_size),
                1,
                256.min(self.opts.max_block_size),
            ),
            Strategy::Warp => (
                32,
                256.min(self.opts.max_block_size),
                1,
                256.min(self.opts.max_block_size) / 32,
            ),
            Strategy::Block(t) => (t, t, 1, 1),
            Strategy::ColumnTile => (self.tile_y(), TILE_X, self.tile_y(), TILE_X),
        };
        let row_len = k.row_len();
        let per_lane = row_len.div_ceil(group as usize);
        let passes = self.sweeps + usize::from(self.has_element_stores());
        let cached = matches!(strat, Strategy::Warp | Strategy::Block(_))
            && passes > 1
            && per_lane <= MAX_CACHED
            && row_len > 0;
        let strategy = format!(
            "{}, {} threads per block{}",
            match strat {
                Strategy::Thread => "thread per row".to_string(),
                Strategy::Warp => "warp per row".to_string(),
                Strategy::Block(_) => "block per row".to_string(),
                Strategy::ColumnTile => format!(
                    "column tile: {TILE_X} rows side by side, {} threads down each",
                    self.tile_y()
                ),
            },
            threads_x * threads_y,
            if cached {
                format!(", row in registers ({per_lane} per lane)")
            } else if passes > 1 {
                format!(", {passes} passes over each row")
            } else {
                String::new()
            }
        );
        let name = k.name.clone();
        self.open_function(&name, threads_x * threads_y);
        let ind = "  ";
        let (rb_start, rb_step, r_in_block, lane) = match strat {
            Strategy::Thread => (
                format!("(nd_idx)blockIdx.x * {threads_x}"),
                format!("(nd_idx)gridDim.x * {threads_x}"),
                "threadIdx.x".to_string(),
                "0".to_string(),
            ),
            Strategy::Warp => (
                format!("(nd_idx)blockIdx.x * {rows_per_block}"),
                format!("(nd_idx)gridDim.x * {rows_per_block}"),
                "(threadIdx.x >> 5)".to_string(),
                "(threadIdx.x & 31)".to_string(),
            ),
            Strategy::Block(_) => (
                "(nd_idx)blockIdx.x".to_string(),
                "(nd_idx)gridDim.x".to_string(),
                "0".to_string(),
                "threadIdx.x".to_string(),
            ),
            Strategy::ColumnTile => (
                format!("(nd_idx)blockIdx.x * {TILE_X}"),
                format!("(nd_idx)gridDim.x * {TILE_X}"),
                "threadIdx.x".to_string(),
                "threadIdx.y".to_string(),
            ),
        };
        let _ = writeln!(self.body, "{ind}const int lane = {lane};");
        let _ = writeln!(
            self.body,
            "{ind}for (nd_idx rb = {rb_start}; rb < {rows}; rb += {rb_step}) {{"
        );
        let ind2 = "    ";
        let _ = writeln!(self.body, "{ind2}const nd_idx r = rb + {r_in_block};");
        let _ = writeln!(self.body, "{ind2}const bool active = r < {rows};");
        let _ = writeln!(self.body, "{ind2}const nd_idx ra = active ? r : 0;");
        let ri = RowIndex::new(k);
        self.row_prologue(&ri, ind2);
        let lanes = Lanes {
            group,
            strat,
            cached: cached.then_some(per_lane),
            start: "lane".into(),
            end: row_len.to_string(),
        };
        if cached {
            self.cache_row(&ri, &lanes, ind2);
        }
        for s in 0..self.sweeps {
            self.row_values(s, Results::Local, ind2);
            self.sweep(&ri, &lanes, s, ind2);
        }
        self.row_values(self.sweeps, Results::Local, ind2);
        self.per_row_stores("active && lane == 0", ind2);
        if self.has_element_stores() {
            self.store_sweep(&ri, &lanes, "active", ind2);
        }
        let _ = writeln!(self.body, "{ind}}}\n}}");
        let grid = self.grid_for(rows, rows_per_block as usize);
        let launches = if rows == 0 {
            vec![]
        } else {
            vec![Launch {
                function: name,
                grid,
                block: (threads_x, threads_y),
            }]
        };
        (launches, strategy)
    }

    /// Threads down each column of a tile: `TILE_Y`, or fewer to fit `max_block_size`.
    fn tile_y(&self) -> u32 {
        (self.opts.max_block_size / TILE_X).clamp(1, TILE_Y)
    }

    fn has_element_stores(&self) -> bool {
        self.k
            .stores
            .iter()
            .any(|s| !per_row(self.k, &self.levels, s))
    }

    /// Row-level loads (per row, from the kept index).
    fn row_prologue(&mut self, ri: &RowIndex, ind: &str) {
        self.body.push_str(&ri.kept.decompose("ra", "k", ind));
        for (i, ins) in self.k.body.iter().enumerate() {
            if let Expr::Load { input, view } = &ins.expr {
                let v = ri.load_view[i].expect("loads have views");
                let base = ri.kept.offset(v, "ra", "k", view.offset);
                if self.levels[i] == Level::Row {
                    let t = scalar::compute_type(ins.dtype);
                    let e = self.load_expr(*input, &base);
                    let _ = writeln!(self.body, "{ind}const {t} v{i} = {e};");
                } else {
                    let _ = writeln!(self.body, "{ind}const nd_idx base{i} = {base};");
                }
            }
        }
        if self.has_element_stores() {
            let base = ri.kept.offset(ri.out_view, "ra", "k", 0);
            let _ = writeln!(self.body, "{ind}const nd_idx obase = {base};");
        }
    }

    /// Row values of stage `upto` (reductions too when their results are read from
    /// the scratch buffer). Calling it for each stage in turn defines each once.
    fn row_values(&mut self, upto: usize, results: Results, ind: &str) {
        for i in 0..self.k.body.len() {
            if self.levels[i] != Level::Row || self.stage[i] > upto {
                continue;
            }
            if self.stage[i] != upto {
                continue;
            }
            match self.k.body[i].expr {
                Expr::Load { .. } => {}
                Expr::Reduce(..) | Expr::ArgReduce(..) => {
                    if results == Results::Scratch {
                        let t = scalar::compute_type(self.k.body[i].dtype);
                        let off = self.scratch_slot(i).1;
                        let _ = writeln!(
                            self.body,
                            "{ind}const {t} v{i} = reinterpret_cast<const {t}*>(scratch + {off})[ra];"
                        );
                    }
                }
                _ => self.define(i, ind),
            }
        }
    }

    /// The element values needed for `targets`, in body order.
    fn closure(&self, targets: &[usize]) -> Vec<usize> {
        let k = self.k;
        let mut need = vec![false; k.body.len()];
        for &t in targets {
            if self.levels[t] == Level::Element {
                need[t] = true;
            }
        }
        for i in (0..k.body.len()).rev() {
            if need[i] {
                for v in Kernel::operands(&k.body[i].expr) {
                    if self.levels[v.index()] == Level::Element {
                        need[v.index()] = true;
                    }
                }
            }
        }
        (0..k.body.len()).filter(|&i| need[i]).collect()
    }

    /// Element load `i` at element index `j` (decomposed as `e{a}`), or its cached copy.
    fn element_load(&self, ri: &RowIndex, i: usize, lanes: &Lanes) -> String {
        if lanes.cached.is_some() {
            return format!("c{i}[u]");
        }
        let Expr::Load { input, .. } = &self.k.body[i].expr else {
            unreachable!("element_load of a load")
        };
        let v = ri.load_view[i].expect("loads have views");
        let e = ri.red.offset(v, "j", "e", 0);
        self.load_expr(*input, &format!("base{i} + {e}"))
    }

    /// Opens the loop over this lane's elements: `j` is the element index, `u` the
    /// iteration number when the row is cached.
    fn open_lane_loop(&mut self, ri: &RowIndex, lanes: &Lanes, ind: &str) -> String {
        let ind2 = format!("{ind}  ");
        match lanes.cached {
            Some(per_lane) => {
                let _ = writeln!(self.body, "{ind}#pragma unroll");
                let _ = writeln!(self.body, "{ind}for (int u = 0; u < {per_lane}; ++u) {{");
                let _ = writeln!(
                    self.body,
                    "{ind2}const nd_idx j = {} + (nd_idx)u * {};",
                    lanes.start, lanes.group
                );
                let _ = writeln!(self.body, "{ind2}if (j < {}) {{", lanes.end);
                let ind3 = format!("{ind2}  ");
                self.body.push_str(&ri.red.decompose("j", "e", &ind3));
                ind3
            }
            None => {
                // Unrolled so that each thread has several independent loads in flight.
                let _ = writeln!(self.body, "{ind}#pragma unroll 4");
                let _ = writeln!(
                    self.body,
                    "{ind}for (nd_idx j = {}; j < {}; j += {}) {{",
                    lanes.start, lanes.end, lanes.group
                );
                self.body.push_str(&ri.red.decompose("j", "e", &ind2));
                ind2
            }
        }
    }

    fn close_lane_loop(&mut self, lanes: &Lanes, ind: &str) {
        if lanes.cached.is_some() {
            let _ = writeln!(self.body, "{ind}  }}");
        }
        let _ = writeln!(self.body, "{ind}}}");
    }

    /// The first pass of a cached row: every element load into registers.
    fn cache_row(&mut self, ri: &RowIndex, lanes: &Lanes, ind: &str) {
        let per_lane = lanes.cached.expect("cached");
        let loads: Vec<usize> = (0..self.k.body.len())
            .filter(|&i| {
                self.levels[i] == Level::Element && matches!(self.k.body[i].expr, Expr::Load { .. })
            })
            .collect();
        for &i in &loads {
            let t = scalar::compute_type(self.k.body[i].dtype);
            let _ = writeln!(self.body, "{ind}{t} c{i}[{per_lane}];");
        }
        let direct = Lanes {
            cached: None,
            ..lanes.clone()
        };
        let ind2 = self.open_lane_loop(ri, lanes, ind);
        for &i in &loads {
            let e = self.element_load(ri, i, &direct);
            let _ = writeln!(self.body, "{ind2}c{i}[u] = {e};");
        }
        self.close_lane_loop(lanes, ind);
    }

    /// Emits element instruction `i` at the current element (loads from the row cache
    /// or memory).
    fn element_value(&mut self, ri: &RowIndex, i: usize, lanes: &Lanes, ind: &str) {
        if matches!(self.k.body[i].expr, Expr::Load { .. }) {
            let t = scalar::compute_type(self.k.body[i].dtype);
            let e = self.element_load(ri, i, lanes);
            let _ = writeln!(self.body, "{ind}const {t} v{i} = {e};");
        } else {
            self.define(i, ind);
        }
    }

    /// Accumulator C types of reduction `i`: (value type, whether it carries an index).
    fn acc_types(&self, i: usize) -> (&'static str, bool) {
        match &self.k.body[i].expr {
            Expr::Reduce(_, _) => (scalar::compute_type(self.k.body[i].dtype), false),
            Expr::ArgReduce(_, a) => (scalar::compute_type(self.k.body[a.index()].dtype), true),
            _ => unreachable!("acc_types of a reduction"),
        }
    }

    /// Reductions of sweep `s`.
    fn reductions_of(&self, s: usize) -> Vec<usize> {
        (0..self.k.body.len())
            .filter(|&i| {
                matches!(self.k.body[i].expr, Expr::Reduce(..) | Expr::ArgReduce(..))
                    && self.stage[i] == s + 1
            })
            .collect()
    }

    /// Declares the accumulators of reductions `reds` at their identities.
    fn init_accs(&mut self, reds: &[usize], ind: &str) {
        for &i in reds {
            let (t, arg) = self.acc_types(i);
            match &self.k.body[i].expr {
                Expr::Reduce(op, a) => {
                    let id = scalar::identity(*op, self.k.body[a.index()].dtype);
                    let _ = writeln!(self.body, "{ind}{t} acc{i} = {id};");
                }
                _ => {
                    debug_assert!(arg);
                    self.needs.insert(Helper::Arg);
                    let _ = writeln!(self.body, "{ind}{t} acc{i} = 0; long long idx{i} = -1;");
                }
            }
        }
    }

    /// `acc{i}` updated with the current element `j`.
    fn update_acc(&mut self, i: usize, ind: &str) {
        match self.k.body[i].expr.clone() {
            Expr::Reduce(op, a) => {
                let d = self.k.body[a.index()].dtype.compute_dtype();
                let e = scalar::accumulate(
                    op,
                    d,
                    &format!("acc{i}"),
                    &format!("v{}", a.0),
                    &mut self.needs,
                );
                let _ = writeln!(self.body, "{ind}acc{i} = {e};");
            }
            Expr::ArgReduce(op, a) => {
                let max = op == ArgReduceOp::ArgMax;
                let _ = writeln!(
                    self.body,
                    "{ind}if (nd_arg_better<{max}>(v{a}, (long long)j, acc{i}, idx{i})) {{ acc{i} = v{a}; idx{i} = j; }}",
                    a = a.0
                );
            }
            _ => unreachable!("update_acc of a reduction"),
        }
    }

    /// One reduction sweep `s`: accumulate over this lane's elements, combine over the
    /// group, define the results `v{i}`.
    fn sweep(&mut self, ri: &RowIndex, lanes: &Lanes, s: usize, ind: &str) {
        let reds = self.reductions_of(s);
        self.init_accs(&reds, ind);
        let operands: Vec<usize> = reds
            .iter()
            .map(|&i| Kernel::operands(&self.k.body[i].expr)[0].index())
            .collect();
        let elems = self.closure(&operands);
        let ind2 = self.open_lane_loop(ri, lanes, ind);
        for &i in &elems {
            self.element_value(ri, i, lanes, &ind2);
        }
        for &i in &reds {
            self.update_acc(i, &ind2);
        }
        self.close_lane_loop(lanes, ind);
        self.group_combine(&reds, lanes, ind);
        for &i in &reds {
            let t = scalar::compute_type(self.k.body[i].dtype);
            let src = match self.k.body[i].expr {
                Expr::ArgReduce(..) => format!("(idx{i} < 0 ? 0LL : idx{i})"),
                _ => format!("acc{i}"),
            };
            let _ = writeln!(self.body, "{ind}const {t} v{i} = {src};");
        }
    }

    /// `acc{i} (+)= other` for reduction `i`, as a statement; `other` names the other
    /// partial's value, and `other_idx` its index for an arg-reduction.
    fn combine_stmt(&mut self, i: usize, other: &str, other_idx: &str, ind: &str) -> String {
        match self.k.body[i].expr.clone() {
            Expr::Reduce(op, x) => {
                let d = self.k.body[x.index()].dtype.compute_dtype();
                let e = scalar::accumulate(op, d, &format!("acc{i}"), other, &mut self.needs);
                format!("{ind}acc{i} = {e};\n")
            }
            Expr::ArgReduce(op, _) => {
                let max = op == ArgReduceOp::ArgMax;
                format!(
                    "{ind}if (nd_arg_better<{max}>({other}, {other_idx}, acc{i}, idx{i})) {{ acc{i} = {other}; idx{i} = {other_idx}; }}\n"
                )
            }
            _ => unreachable!("combine of a reduction"),
        }
    }

    /// Combines the lanes' accumulators of `reds` over the group; every lane ends with
    /// the row's result.
    fn group_combine(&mut self, reds: &[usize], lanes: &Lanes, ind: &str) {
        match lanes.strat {
            Strategy::Thread => {}
            Strategy::Warp => self.warp_combine(reds, ind),
            Strategy::Block(t) => {
                self.warp_combine(reds, ind);
                let warps = t / 32;
                if warps > 1 {
                    self.smem_combine(
                        reds,
                        ind,
                        warps,
                        "(threadIdx.x >> 5)",
                        "(threadIdx.x & 31) == 0",
                        "",
                    );
                }
            }
            Strategy::ColumnTile => {
                let ty = self.tile_y();
                self.smem_combine(reds, ind, ty, "threadIdx.y", "true", "[threadIdx.x]");
            }
        }
    }

    /// Butterfly over the 32 lanes of a warp: every lane ends with the same value, since
    /// each step combines the same two partials (in either order, and every combine is
    /// commutative).
    fn warp_combine(&mut self, reds: &[usize], ind: &str) {
        let _ = writeln!(self.body, "{ind}#pragma unroll");
        let _ = writeln!(self.body, "{ind}for (int o = 16; o > 0; o >>= 1) {{");
        let ind2 = format!("{ind}  ");
        for &i in reds {
            let (t, arg) = self.acc_types(i);
            if t == "bool" {
                let _ = writeln!(
                    self.body,
                    "{ind2}const bool oth{i} = __shfl_xor_sync(0xffffffffu, (int)acc{i}, o) != 0;"
                );
            } else {
                let _ = writeln!(
                    self.body,
                    "{ind2}const {t} oth{i} = __shfl_xor_sync(0xffffffffu, acc{i}, o);"
                );
            }
            if arg {
                let _ = writeln!(
                    self.body,
                    "{ind2}const long long othidx{i} = __shfl_xor_sync(0xffffffffu, idx{i}, o);"
                );
            }
            let st = self.combine_stmt(i, &format!("oth{i}"), &format!("othidx{i}"), &ind2);
            self.body.push_str(&st);
        }
        let _ = writeln!(self.body, "{ind}}}");
    }

    /// Partials through shared memory: slot `slot` of `n` writes (when `writer`), then
    /// every thread combines slots `0..n` in order. `col` indexes a second dimension
    /// (the column tile's x).
    fn smem_combine(
        &mut self,
        reds: &[usize],
        ind: &str,
        n: u32,
        slot: &str,
        writer: &str,
        col: &str,
    ) {
        let width = if col.is_empty() {
            String::new()
        } else {
            format!("[{TILE_X}]")
        };
        let _ = writeln!(self.body, "{ind}{{");
        let ind2 = format!("{ind}  ");
        for &i in reds {
            let (t, arg) = self.acc_types(i);
            let _ = writeln!(self.body, "{ind2}__shared__ {t} sm{i}[{n}]{width};");
            if arg {
                let _ = writeln!(self.body, "{ind2}__shared__ long long smi{i}[{n}]{width};");
            }
        }
        let _ = writeln!(self.body, "{ind2}__syncthreads();");
        let guarded = writer != "true";
        let wind = if guarded {
            format!("{ind2}  ")
        } else {
            ind2.clone()
        };
        if guarded {
            let _ = writeln!(self.body, "{ind2}if ({writer}) {{");
        }
        for &i in reds {
            let (_, arg) = self.acc_types(i);
            let _ = writeln!(self.body, "{wind}sm{i}[{slot}]{col} = acc{i};");
            if arg {
                let _ = writeln!(self.body, "{wind}smi{i}[{slot}]{col} = idx{i};");
            }
        }
        if guarded {
            let _ = writeln!(self.body, "{ind2}}}");
        }
        let _ = writeln!(self.body, "{ind2}__syncthreads();");
        for &i in reds {
            let (t, arg) = self.acc_types(i);
            let _ = writeln!(self.body, "{ind2}acc{i} = sm{i}[0]{col};");
            if arg {
                let _ = writeln!(self.body, "{ind2}idx{i} = smi{i}[0]{col};");
            }
            let _ = writeln!(self.body, "{ind2}for (int s = 1; s < {n}; ++s) {{");
            let _ = writeln!(self.body, "{ind2}  const {t} othacc{i} = sm{i}[s]{col};");
            if arg {
                let _ = writeln!(
                    self.body,
                    "{ind2}  const long long othidx{i} = smi{i}[s]{col};"
                );
            }
            let st = self.combine_stmt(
                i,
                &format!("othacc{i}"),
                &format!("othidx{i}"),
                &format!("{ind2}  "),
            );
            self.body.push_str(&st);
            let _ = writeln!(self.body, "{ind2}}}");
        }
        let _ = writeln!(self.body, "{ind}}}");
    }

    /// Stores of row values into per-row outputs, by one thread of the group.
    fn per_row_stores(&mut self, guard: &str, ind: &str) {
        let k = self.k;
        let stores: Vec<_> = k
            .stores
            .iter()
            .filter(|s| per_row(k, &self.levels, s))
            .cloned()
            .collect();
        if stores.is_empty() {
            return;
        }
        let guarded = guard != "true";
        let sind = if guarded {
            format!("{ind}  ")
        } else {
            ind.to_string()
        };
        if guarded {
            let _ = writeln!(self.body, "{ind}if ({guard}) {{");
        }
        for s in stores {
            let d = k.outputs[s.output].dtype;
            let _ = writeln!(
                self.body,
                "{sind}out{}[r] = {};",
                s.output,
                scalar::store_conv(d, &format!("v{}", s.value.0))
            );
        }
        if guarded {
            let _ = writeln!(self.body, "{ind}}}");
        }
    }

    /// The final sweep: element stores (row values broadcast along the row).
    fn store_sweep(&mut self, ri: &RowIndex, lanes: &Lanes, guard: &str, ind: &str) {
        let k = self.k;
        let stores: Vec<_> = k
            .stores
            .iter()
            .filter(|s| !per_row(k, &self.levels, s))
            .cloned()
            .collect();
        let targets: Vec<usize> = stores.iter().map(|s| s.value.index()).collect();
        let elems = self.closure(&targets);
        let guarded = guard != "true";
        let ind1 = if guarded {
            format!("{ind}  ")
        } else {
            ind.to_string()
        };
        if guarded {
            let _ = writeln!(self.body, "{ind}if ({guard}) {{");
        }
        let ind2 = self.open_lane_loop(ri, lanes, &ind1);
        for &i in &elems {
            self.element_value(ri, i, lanes, &ind2);
        }
        let off = ri.red.offset(ri.out_view, "j", "e", 0);
        for s in stores {
            let d = k.outputs[s.output].dtype;
            let _ = writeln!(
                self.body,
                "{ind2}out{}[obase + {off}] = {};",
                s.output,
                scalar::store_conv(d, &format!("v{}", s.value.0))
            );
        }
        self.close_lane_loop(lanes, &ind1);
        if guarded {
            let _ = writeln!(self.body, "{ind}}}");
        }
    }

    // -----------------------------------------------------------------------------------
    // Split reductions

    /// Byte layout of the scratch buffer: per reduction (in body order), its partials
    /// (`rows * splits` accumulator values, then as many i64 indices for
    /// arg-reductions) and its results (`rows` values of the instruction's type).
    /// Returns (per reduction: instruction, partials offset, results offset) and the
    /// total, every region 16-byte aligned.
    fn scratch_layout(&self) -> (Vec<(usize, usize, usize)>, usize) {
        let Plan::Split { rows, splits, .. } = self.k.plan else {
            return (Vec::new(), 0);
        };
        let mut at = 0usize;
        let mut slots = Vec::new();
        for (i, ins) in self.k.body.iter().enumerate() {
            if !matches!(ins.expr, Expr::Reduce(..) | Expr::ArgReduce(..)) {
                continue;
            }
            let (t, arg) = self.acc_types(i);
            let partials = at;
            at = (at + rows * splits * c_size(t)).next_multiple_of(16);
            if arg {
                at = (at + rows * splits * 8).next_multiple_of(16);
            }
            let results = at;
            at = (at + rows * c_size(scalar::compute_type(ins.dtype))).next_multiple_of(16);
            slots.push((i, partials, results));
        }
        (slots, at)
    }

    /// (partials offset, results offset) of reduction `i` in the scratch buffer.
    fn scratch_slot(&self, i: usize) -> (usize, usize) {
        let (slots, _) = self.scratch_layout();
        let (_, p, r) = slots
            .into_iter()
            .find(|s| s.0 == i)
            .expect("every reduction has a scratch slot");
        (p, r)
    }

    /// Statements moving reduction `i`'s partial number `slot` (a C expression) between
    /// the scratch buffer and the variables `{prefix}acc{i}` / `{prefix}idx{i}` (the
    /// index only for arg-reductions): a store when `write`, else declarations that
    /// load it.
    fn partial_io(&self, i: usize, slot: &str, prefix: &str, write: bool, ind: &str) -> String {
        let (t, arg) = self.acc_types(i);
        let (p, _) = self.scratch_slot(i);
        let (_, _, _, work) = self.split_shape();
        let mut parts = vec![(t, p, format!("{prefix}acc{i}"))];
        if arg {
            parts.push((
                "long long",
                self.index_offset(i, p, work),
                format!("{prefix}idx{i}"),
            ));
        }
        parts
            .into_iter()
            .map(|(ty, at, var)| {
                if write {
                    format!("{ind}reinterpret_cast<{ty}*>(scratch + {at})[{slot}] = {var};\n")
                } else {
                    format!("{ind}{ty} {var} = reinterpret_cast<const {ty}*>(scratch + {at})[{slot}];\n")
                }
            })
            .collect()
    }

    /// Byte offset of the index array that follows `n` values of reduction `i` at `at`.
    fn index_offset(&self, i: usize, at: usize, n: usize) -> usize {
        let (t, _) = self.acc_types(i);
        (at + n * c_size(t)).next_multiple_of(16)
    }

    /// (threads, splits, chunk length, work items = rows x splits) of a split kernel.
    fn split_shape(&self) -> (u32, usize, usize, usize) {
        let Plan::Split { splits, .. } = self.k.plan else {
            unreachable!("split_shape of a split plan")
        };
        let splits = splits.max(1);
        let chunk = self.k.row_len().div_ceil(splits).max(1);
        (
            256.min(self.opts.max_block_size),
            splits,
            chunk,
            self.k.rows() * splits,
        )
    }

    /// Opens a function of one block per (row, chunk) of a split kernel: the loop over
    /// work items `w` (row `ra`, chunk `c`, chunk end `jend`), the row's loads, and the
    /// row values up to `stage`, reductions read from the scratch buffer. Two levels of
    /// braces are left open.
    fn open_chunk_function(&mut self, name: &str, ri: &RowIndex, stage: usize) {
        let (threads, splits, chunk, work) = self.split_shape();
        let row_len = self.k.row_len();
        self.open_function(name, threads);
        let (ind, ind2) = ("  ", "    ");
        let _ = writeln!(self.body, "{ind}const int lane = threadIdx.x;");
        let _ = writeln!(
            self.body,
            "{ind}for (nd_idx w = blockIdx.x; w < {work}; w += gridDim.x) {{"
        );
        let _ = writeln!(
            self.body,
            "{ind2}const nd_idx ra = w / {splits}, c = w % {splits};"
        );
        let _ = writeln!(
            self.body,
            "{ind2}const nd_idx jend = min((c + 1) * {chunk}, (nd_idx){row_len});"
        );
        self.row_prologue(ri, ind2);
        for t in 0..=stage {
            self.row_values(t, Results::Scratch, ind2);
        }
    }

    fn split_program(&mut self, splits: usize) -> (Vec<Launch>, String) {
        let k = self.k;
        let rows = k.rows();
        let row_len = k.row_len();
        let chunk = row_len.div_ceil(splits).max(1);
        let threads = 256.min(self.opts.max_block_size);
        let ri = RowIndex::new(k);
        let mut launches = Vec::new();
        let work = rows * splits;
        for s in 0..self.sweeps {
            // Partials: one block per (row, chunk).
            let fname = format!("{}_p{s}", k.name);
            self.open_chunk_function(&fname, &ri, s);
            let (ind, ind2) = ("  ", "    ");
            let lanes = Lanes {
                group: threads,
                strat: Strategy::Block(threads),
                cached: None,
                start: format!("c * {chunk} + lane"),
                end: "jend".into(),
            };
            let reds = self.reductions_of(s);
            self.init_accs(&reds, ind2);
            let operands: Vec<usize> = reds
                .iter()
                .map(|&i| Kernel::operands(&self.k.body[i].expr)[0].index())
                .collect();
            let elems = self.closure(&operands);
            let ind3 = self.open_lane_loop(&ri, &lanes, ind2);
            for &i in &elems {
                self.element_value(&ri, i, &lanes, &ind3);
            }
            for &i in &reds {
                self.update_acc(i, &ind3);
            }
            self.close_lane_loop(&lanes, ind2);
            self.group_combine(&reds, &lanes, ind2);
            let _ = writeln!(self.body, "{ind2}if (lane == 0) {{");
            for &i in &reds {
                let io = self.partial_io(i, "w", "", true, &format!("{ind2}  "));
                self.body.push_str(&io);
            }
            let _ = writeln!(self.body, "{ind2}}}");
            let _ = writeln!(self.body, "{ind}}}\n}}");
            launches.push(Launch {
                function: fname,
                grid: self.grid_for(work, 1),
                block: (threads, 1),
            });

            // Finish: one thread per row combines the partials in chunk order.
            let fname = format!("{}_f{s}", k.name);
            self.open_function(&fname, threads);
            let _ = writeln!(
                self.body,
                "{ind}for (nd_idx r = (nd_idx)blockIdx.x * blockDim.x + threadIdx.x; r < {rows}; r += (nd_idx)gridDim.x * blockDim.x) {{"
            );
            let _ = writeln!(self.body, "{ind2}const nd_idx ra = r;");
            for &i in &reds {
                let (_, res) = self.scratch_slot(i);
                let first = self.partial_io(i, &format!("r * {splits}"), "", false, ind2);
                self.body.push_str(&first);
                let _ = writeln!(self.body, "{ind2}for (nd_idx c = 1; c < {splits}; ++c) {{");
                let next = self.partial_io(
                    i,
                    &format!("r * {splits} + c"),
                    "oth",
                    false,
                    &format!("{ind2}  "),
                );
                self.body.push_str(&next);
                let st = self.combine_stmt(
                    i,
                    &format!("othacc{i}"),
                    &format!("othidx{i}"),
                    &format!("{ind2}  "),
                );
                self.body.push_str(&st);
                let _ = writeln!(self.body, "{ind2}}}");
                let store = match self.k.body[i].expr {
                    Expr::ArgReduce(..) => format!("(idx{i} < 0 ? 0LL : idx{i})"),
                    _ => format!("acc{i}"),
                };
                let vt = scalar::compute_type(self.k.body[i].dtype);
                let _ = writeln!(
                    self.body,
                    "{ind2}reinterpret_cast<{vt}*>(scratch + {res})[r] = {store};"
                );
            }
            if s + 1 == self.sweeps {
                let reads: Vec<usize> = (0..=self.sweeps).collect();
                if k.stores.iter().any(|st| per_row(k, &self.levels, st)) {
                    self.row_prologue_rows_only(&ri, ind2);
                    for t in reads {
                        self.row_values(t, Results::Scratch, ind2);
                    }
                    self.per_row_stores("true", ind2);
                }
            }
            let _ = writeln!(self.body, "{ind}}}\n}}");
            launches.push(Launch {
                function: fname,
                grid: self.grid_for(rows, threads as usize),
                block: (threads, 1),
            });
        }
        if self.has_element_stores() {
            let fname = format!("{}_st", k.name);
            self.open_chunk_function(&fname, &ri, self.sweeps);
            let (ind, ind2) = ("  ", "    ");
            let lanes = Lanes {
                group: threads,
                strat: Strategy::Block(threads),
                cached: None,
                start: format!("c * {chunk} + lane"),
                end: "jend".into(),
            };
            self.store_sweep(&ri, &lanes, "true", ind2);
            let _ = writeln!(self.body, "{ind}}}\n}}");
            launches.push(Launch {
                function: fname,
                grid: self.grid_for(work, 1),
                block: (threads, 1),
            });
        }
        if rows == 0 {
            launches.clear();
        }
        let strategy = format!(
            "split: {splits} chunks of {chunk} per row, one {threads}-thread block per chunk, partials combined in chunk order ({} launches)",
            launches.len()
        );
        (launches, strategy)
    }

    /// Row-level loads only (no element bases), for the finish functions.
    fn row_prologue_rows_only(&mut self, ri: &RowIndex, ind: &str) {
        self.body.push_str(&ri.kept.decompose("ra", "k", ind));
        for (i, ins) in self.k.body.iter().enumerate() {
            if let Expr::Load { input, view } = &ins.expr {
                if self.levels[i] == Level::Row {
                    let v = ri.load_view[i].expect("loads have views");
                    let base = ri.kept.offset(v, "ra", "k", view.offset);
                    let t = scalar::compute_type(ins.dtype);
                    let e = self.load_expr(*input, &base);
                    let _ = writeln!(self.body, "{ind}const {t} v{i} = {e};");
                }
            }
        }
    }
}

/// How lanes walk a row in a loop.
#[derive(Clone)]
struct Lanes {
    group: u32,
    strat: Strategy,
    /// Elements per lane kept in registers, when the row is cached.
    cached: Option<usize>,
    /// First element index of this lane.
    start: String,
    /// One past the last element index of the row (or chunk).
    end: String,
}

/// The kept and reduced parts of every load's index map (and of the contiguous output).
struct RowIndex {
    kept: Space,
    red: Space,
    /// Per instruction that is a load: its view number in `kept` / `red`.
    load_view: Vec<Option<usize>>,
    /// View number of the row-major output.
    out_view: usize,
}

impl RowIndex {
    fn new(k: &Kernel) -> RowIndex {
        let rank = k.domain.rank();
        let kept_axes: Vec<usize> = (0..rank).filter(|a| !k.reduce_axes.contains(a)).collect();
        let red_axes = &k.reduce_axes;
        let dims = k.domain.dims();
        let mut kept_views = Vec::new();
        let mut red_views = Vec::new();
        let mut load_view = vec![None; k.body.len()];
        for (i, ins) in k.body.iter().enumerate() {
            if let Expr::Load { view, .. } = &ins.expr {
                load_view[i] = Some(kept_views.len());
                kept_views.push(
                    kept_axes
                        .iter()
                        .map(|&a| view.strides[a])
                        .collect::<Vec<_>>(),
                );
                red_views.push(
                    red_axes
                        .iter()
                        .map(|&a| view.strides[a])
                        .collect::<Vec<_>>(),
                );
            }
        }
        let out = Shape::new(dims.to_vec()).contiguous_strides();
        let out_view = kept_views.len();
        kept_views.push(kept_axes.iter().map(|&a| out[a]).collect());
        red_views.push(red_axes.iter().map(|&a| out[a]).collect());
        let kd: Vec<usize> = kept_axes.iter().map(|&a| dims[a]).collect();
        let rd: Vec<usize> = red_axes.iter().map(|&a| dims[a]).collect();
        RowIndex {
            kept: coalesce(&kd, &kept_views),
            red: coalesce(&rd, &red_views),
            load_view,
            out_view,
        }
    }
}

/// Whether store `s` writes one element per row (the rule of `Kernel::check`).
fn per_row(k: &Kernel, levels: &[Level], s: &ndfuse_ir::Store) -> bool {
    levels[s.value.index()] == Level::Row && k.outputs[s.output].len == k.rows()
}

fn pow2_floor(x: u32) -> u32 {
    if x == 0 {
        1
    } else {
        1 << (31 - x.leading_zeros())
    }
}

fn pow2_ceil(x: u32) -> u32 {
    x.max(1).next_power_of_two()
}

/// Bytes of one value of C type `t`.
fn c_size(t: &str) -> usize {
    match t {
        "double" | "long long" => 8,
        "bool" => 1,
        _ => 4,
    }
}
