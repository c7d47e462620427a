//! Kernel descriptions built by hand with positions and gathers (`Expr::Position`,
//! `Expr::Gather`), shared by the CUDA tests that pin their CUDA C, compile them with
//! NVRTC and run them in the emulator: the shapes a pad, a row gather, a gather along the
//! last axis and a gathered matmul epilogue take.

use ndfuse_ir::{
    BinaryOp, Buffer, DType, Expr, GatherAxis, Instr, Kernel, Plan, Scalar, Shape, Store, ValueId,
    View,
};

/// A kernel body under construction, one instruction a `push`.
#[derive(Debug, Default)]
pub struct Body(pub Vec<Instr>);

impl Body {
    pub fn push(&mut self, dtype: DType, expr: Expr) -> ValueId {
        self.0.push(Instr { dtype, expr });
        ValueId(self.0.len() as u32 - 1)
    }

    pub fn int(&mut self, v: i64) -> ValueId {
        self.push(DType::I64, Expr::Const(Scalar::I(v)))
    }

    pub fn binary(&mut self, dtype: DType, op: BinaryOp, a: ValueId, b: ValueId) -> ValueId {
        self.push(dtype, Expr::Binary(op, a, b))
    }
}

pub fn view(dims: &[usize], strides: &[isize], offset: isize) -> View {
    View {
        shape: Shape::new(dims.to_vec()),
        strides: strides.to_vec(),
        offset,
    }
}

/// An element-wise kernel over `domain` storing `out` into its one output.
pub fn elementwise_kernel(
    name: &str,
    domain: &[usize],
    inputs: Vec<Buffer>,
    body: Body,
    out: ValueId,
) -> Kernel {
    let domain = Shape::new(domain.to_vec());
    let dtype = body.0[out.index()].dtype;
    let k = Kernel {
        name: name.into(),
        outputs: vec![Buffer {
            dtype,
            len: domain.numel(),
        }],
        domain,
        reduce_axes: vec![],
        inputs,
        body: body.0,
        stores: vec![Store {
            value: out,
            output: 0,
        }],
        plan: Plan::Elementwise,
        plan_reason: "element-wise".into(),
        contraction: None,
    };
    k.check()
        .unwrap_or_else(|e| panic!("{name} is not a valid kernel: {e:?}\n{k}"));
    k
}

/// `iota * 2 + 1` as `dtype`, the iota's positions read through `strides` from `offset`.
pub fn position_kernel(dtype: DType, dims: &[usize], strides: &[isize], offset: isize) -> Kernel {
    let mut b = Body::default();
    let pos = b.push(
        DType::I64,
        Expr::Position {
            view: view(dims, strides, offset),
        },
    );
    let two = b.int(2);
    let twice = b.binary(DType::I64, BinaryOp::Mul, pos, two);
    let one = b.int(1);
    let odd = b.binary(DType::I64, BinaryOp::Add, twice, one);
    let out = b.push(dtype, Expr::Cast(odd));
    elementwise_kernel("k0_position_mul_add_cast", dims, vec![], b, out)
}

/// `x[idx]` along axis 0: rows of `x: dtype[rows, cols]` picked by `idx: i64[n]`; a
/// user's index when `checked` (the reference refuses one out of range), else one the
/// clamp takes care of.
pub fn gather_rows_kernel(
    dtype: DType,
    rows: usize,
    cols: usize,
    n: usize,
    checked: bool,
) -> Kernel {
    let dims = [n, cols];
    let mut b = Body::default();
    let idx = b.push(
        DType::I64,
        Expr::Load {
            input: 1,
            view: view(&dims, &[1, 0], 0),
        },
    );
    let out = b.push(
        dtype,
        Expr::Gather {
            input: 0,
            view: view(&dims, &[0, 1], 0),
            axes: vec![GatherAxis {
                index: idx,
                stride: cols as isize,
                extent: rows,
                checked: checked.then_some(0),
            }],
        },
    );
    let inputs = vec![
        Buffer {
            dtype,
            len: rows * cols,
        },
        Buffer {
            dtype: DType::I64,
            len: n,
        },
    ];
    elementwise_kernel("k0_gather", &dims, inputs, b, out)
}

/// `take_along_axis(x, idx, -1)`: `x: dtype[6, 10]` read along its last axis at
/// `idx: i32[6, 20]`, plus 1.
pub fn gather_last_kernel(dtype: DType) -> Kernel {
    let dims = [6, 20];
    let mut b = Body::default();
    let idx = b.push(
        DType::I32,
        Expr::Load {
            input: 1,
            view: View::contiguous(Shape::new(dims.to_vec())),
        },
    );
    let g = b.push(
        dtype,
        Expr::Gather {
            input: 0,
            view: view(&dims, &[10, 0], 0),
            axes: vec![GatherAxis {
                index: idx,
                stride: 1,
                extent: 10,
                checked: Some(1),
            }],
        },
    );
    let one = b.push(dtype, Expr::Const(Scalar::F(1.0)));
    let out = b.binary(dtype, BinaryOp::Add, g, one);
    let inputs = vec![
        Buffer { dtype, len: 60 },
        Buffer {
            dtype: DType::I32,
            len: 120,
        },
    ];
    elementwise_kernel("k0_gather_add", &dims, inputs, b, out)
}

/// A constant pad of `x[1:, 1:]` (`x: dtype[8, 6]`, so 7 x 5 from offset 7) by (1, 2)
/// rows and (3, 1) columns with 0, as the passes lower it: the coordinates shifted and
/// clamped into the input with max / min, one gather of both axes, and a select.
pub fn pad_kernel(dtype: DType) -> Kernel {
    let dims = [10, 9];
    let mut b = Body::default();
    let mut inside = None;
    let mut at = Vec::new();
    for (axis, (before, extent)) in [(1i64, 7i64), (3, 5)].into_iter().enumerate() {
        let mut strides = [0isize; 2];
        strides[axis] = 1;
        let coord = b.push(
            DType::I64,
            Expr::Position {
                view: view(&dims, &strides, 0),
            },
        );
        let shift = b.int(before);
        let i = b.binary(DType::I64, BinaryOp::Sub, coord, shift);
        let (zero, last) = (b.int(0), b.int(extent - 1));
        let low = b.binary(DType::I64, BinaryOp::Max, i, zero);
        at.push(b.binary(DType::I64, BinaryOp::Min, low, last));
        let ge = b.binary(DType::Bool, BinaryOp::Ge, i, zero);
        let le = b.binary(DType::Bool, BinaryOp::Le, i, last);
        let both = b.binary(DType::Bool, BinaryOp::And, ge, le);
        inside = Some(match inside {
            None => both,
            Some(prev) => b.binary(DType::Bool, BinaryOp::And, prev, both),
        });
    }
    let g = b.push(
        dtype,
        Expr::Gather {
            input: 0,
            view: view(&dims, &[0, 0], 7),
            axes: vec![
                GatherAxis {
                    index: at[0],
                    stride: 6,
                    extent: 7,
                    checked: None,
                },
                GatherAxis {
                    index: at[1],
                    stride: 1,
                    extent: 5,
                    checked: None,
                },
            ],
        },
    );
    let zero = b.push(dtype, Expr::Const(Scalar::F(0.0)));
    let inside = inside.expect("two axes");
    let out = b.push(dtype, Expr::Where(inside, g, zero));
    elementwise_kernel(
        "k0_position_sub_max_min_gather_where",
        &dims,
        vec![Buffer { dtype, len: 48 }],
        b,
        out,
    )
}

/// The kernels above in `dtype`: (what, kernel).
pub fn position_and_gather_kernels(dtype: DType) -> Vec<(String, Kernel)> {
    vec![
        (
            format!("{dtype} iota [5, 37] from 3, scalar loop"),
            position_kernel(dtype, &[5, 37], &[37, 1], 3),
        ),
        (
            format!("{dtype} iota [64, 8] transposed, vectorised"),
            position_kernel(dtype, &[8, 64], &[1, 8], 0),
        ),
        (
            format!("{dtype} gather of rows, i64 indices, vectorised"),
            gather_rows_kernel(dtype, 9, 16, 12, true),
        ),
        (
            format!("{dtype} gather of rows, unchecked i64 indices clamped, scalar loop"),
            gather_rows_kernel(dtype, 5, 15, 13, false),
        ),
        (
            format!("{dtype} gather along the last axis, i32 indices"),
            gather_last_kernel(dtype),
        ),
        (
            format!("{dtype} pad of a slice, two-axis gather"),
            pad_kernel(dtype),
        ),
    ]
}

/// `kernel`, a contraction's, with `x[m, n - 5]` added to its stored value: `x` the lhs
/// operand read through the contraction's view at a gathered column (a coordinate of
/// the domain minus 5: negative at first, past K for wide products, so wrapped and
/// clamped).
pub fn with_gathered_epilogue(mut kernel: Kernel) -> Kernel {
    let c = kernel.contraction.clone().expect("a contraction kernel");
    let rank = kernel.domain.rank();
    let dims = kernel.domain.dims().to_vec();
    let lhs = kernel.inputs[c.lhs].dtype;
    let mut b = Body(std::mem::take(&mut kernel.body));
    let mut strides = vec![0isize; rank];
    strides[rank - 1] = 1;
    let n = b.push(
        DType::I64,
        Expr::Position {
            view: view(&dims, &strides, 0),
        },
    );
    let five = b.int(5);
    let col = b.binary(DType::I64, BinaryOp::Sub, n, five);
    let mut fixed = c.lhs_view.strides.clone();
    fixed[rank - 1] = 0;
    let g = b.push(
        lhs,
        Expr::Gather {
            input: c.lhs,
            view: view(&dims, &fixed, c.lhs_view.offset),
            axes: vec![GatherAxis {
                index: col,
                stride: c.lhs_view.strides[rank - 1],
                extent: c.lhs_view.shape.dims()[rank - 1],
                checked: None,
            }],
        },
    );
    let stored = kernel.stores[0].value;
    let dtype = b.0[stored.index()].dtype;
    let g = if lhs == dtype {
        g
    } else {
        b.push(dtype, Expr::Cast(g))
    };
    kernel.stores[0].value = b.binary(dtype, BinaryOp::Add, stored, g);
    kernel.body = b.0;
    kernel.name.push_str("_gather_add");
    kernel
        .check()
        .unwrap_or_else(|e| panic!("{} is not a valid kernel: {e:?}\n{kernel}", kernel.name));
    kernel
}
