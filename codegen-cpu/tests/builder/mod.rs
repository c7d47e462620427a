//! Building kernel descriptions by hand for the tests, and running them.
#![allow(dead_code)] // each test binary uses a different part

use ndfuse_codegen_cpu::{compile, CompiledKernel};
use ndfuse_ir::{
    Accumulate, ArgReduceOp, BinaryOp, Buffer, DType, Expr, HostArray, Instr, Kernel, Plan, Scalar,
    Shape, Store, UnaryOp, ValueId, View,
};

/// A kernel under construction: every `add_*` appends one instruction.
pub struct KernelBuilder {
    k: Kernel,
}

impl KernelBuilder {
    pub fn new(name: &str, domain: &[usize]) -> Self {
        KernelBuilder {
            k: Kernel {
                name: name.to_string(),
                domain: Shape::new(domain),
                inputs: Vec::new(),
                outputs: Vec::new(),
                body: Vec::new(),
                stores: Vec::new(),
                reduce_axes: Vec::new(),
                plan: Plan::Elementwise,
                plan_reason: "element-wise (hand-built test kernel)".to_string(),
                contraction: None,
            },
        }
    }

    pub fn domain(&self) -> Shape {
        self.k.domain.clone()
    }

    fn push(&mut self, dtype: DType, expr: Expr) -> ValueId {
        self.k.body.push(Instr { dtype, expr });
        ValueId(self.k.body.len() as u32 - 1)
    }

    pub fn dtype(&self, v: ValueId) -> DType {
        self.k.body[v.index()].dtype
    }

    /// A new input buffer of `len` elements, read through `view`.
    pub fn load_view(&mut self, dtype: DType, len: usize, view: View) -> ValueId {
        self.k.inputs.push(Buffer { dtype, len });
        let input = self.k.inputs.len() - 1;
        self.push(dtype, Expr::Load { input, view })
    }

    /// A new contiguous input buffer of the domain's shape.
    pub fn load(&mut self, dtype: DType) -> ValueId {
        let view = View::contiguous(self.k.domain.clone());
        let len = self.k.domain.numel();
        self.load_view(dtype, len, view)
    }

    /// A second load of an existing input.
    pub fn reload(&mut self, input: usize, view: View) -> ValueId {
        let dtype = self.k.inputs[input].dtype;
        self.push(dtype, Expr::Load { input, view })
    }

    pub fn constant(&mut self, dtype: DType, value: Scalar) -> ValueId {
        self.push(dtype, Expr::Const(value))
    }

    pub fn unary(&mut self, op: UnaryOp, a: ValueId) -> ValueId {
        let d = self.dtype(a);
        self.push(d, Expr::Unary(op, a))
    }

    pub fn binary(&mut self, op: BinaryOp, a: ValueId, b: ValueId) -> ValueId {
        let d = if op.is_comparison() {
            DType::Bool
        } else {
            self.dtype(a)
        };
        self.push(d, Expr::Binary(op, a, b))
    }

    pub fn select(&mut self, c: ValueId, a: ValueId, b: ValueId) -> ValueId {
        let d = self.dtype(a);
        self.push(d, Expr::Where(c, a, b))
    }

    pub fn cast(&mut self, a: ValueId, to: DType) -> ValueId {
        self.push(to, Expr::Cast(a))
    }

    /// Makes the kernel a row program reducing `axes` (sorted), with the `Rows` plan the
    /// passes would pick; [`Self::plan`] overrides it.
    pub fn reduce_over(&mut self, axes: &[usize]) {
        self.k.reduce_axes = axes.to_vec();
        let rank = self.k.domain.rank();
        let trailing = axes
            .iter()
            .enumerate()
            .all(|(i, &a)| a == rank - axes.len() + i);
        self.k.plan = Plan::Rows {
            rows: self.k.rows(),
            row_len: self.k.row_len(),
            contiguous: trailing,
        };
        self.k.plan_reason = "rows (hand-built test kernel)".to_string();
    }

    pub fn plan(&mut self, plan: Plan) {
        self.k.plan = plan;
    }

    pub fn reduce(&mut self, acc: Accumulate, a: ValueId) -> ValueId {
        let d = self.dtype(a);
        self.push(d, Expr::Reduce(acc, a))
    }

    pub fn arg_reduce(&mut self, op: ArgReduceOp, a: ValueId) -> ValueId {
        self.push(DType::I64, Expr::ArgReduce(op, a))
    }

    /// Stores row value `v` into a new output of one element per row.
    pub fn store_rows(&mut self, v: ValueId) -> usize {
        let dtype = self.dtype(v);
        self.k.outputs.push(Buffer {
            dtype,
            len: self.k.rows(),
        });
        let output = self.k.outputs.len() - 1;
        self.k.stores.push(Store { value: v, output });
        output
    }

    /// Stores `v` into a new output buffer; returns the output's index.
    pub fn store(&mut self, v: ValueId) -> usize {
        let dtype = self.dtype(v);
        self.k.outputs.push(Buffer {
            dtype,
            len: self.k.domain.numel(),
        });
        let output = self.k.outputs.len() - 1;
        self.k.stores.push(Store { value: v, output });
        output
    }

    /// The kernel without running `Kernel::check`, for tests of malformed kernels.
    pub fn build_unchecked(self) -> Kernel {
        self.k
    }

    pub fn build(self) -> Kernel {
        if let Err(errs) = self.k.check() {
            panic!("test kernel is malformed: {errs:?}\n{}", self.k);
        }
        self.k
    }
}

/// A view from its parts.
pub fn view(dims: &[usize], strides: &[isize], offset: isize) -> View {
    View {
        shape: Shape::new(dims),
        strides: strides.to_vec(),
        offset,
    }
}

/// Compiles `kernel`, panicking with the error (tests only).
pub fn compiled(kernel: &Kernel) -> CompiledKernel {
    compile(kernel).unwrap_or_else(|e| panic!("{e}\n{kernel}"))
}

/// Fresh zeroed outputs for `kernel`: shaped like the domain, or flat for per-row ones.
pub fn zeroed_outputs(kernel: &Kernel) -> Vec<HostArray> {
    kernel
        .outputs
        .iter()
        .map(|b| {
            let shape = if b.len == kernel.domain.numel() {
                kernel.domain.clone()
            } else {
                Shape::new([b.len])
            };
            HostArray::zeros(b.dtype, shape)
        })
        .collect()
}

/// Compiles and runs `kernel` over its domain on fresh zeroed outputs.
pub fn run(kernel: &Kernel, inputs: &[&HostArray]) -> Vec<HostArray> {
    let ck = compiled(kernel);
    let mut outs = zeroed_outputs(kernel);
    let mut refs: Vec<&mut HostArray> = outs.iter_mut().collect();
    ck.run(inputs, &mut refs).unwrap_or_else(|e| panic!("{e}"));
    outs
}

/// A 1-d array of `vals` converted to `dtype`, shaped `shape`.
pub fn array(dtype: DType, shape: &[usize], vals: &[f64]) -> HostArray {
    HostArray::from_f64s(dtype, Shape::new(shape), vals)
}

/// `0, 1, 2, ...` as `dtype`.
pub fn iota(dtype: DType, shape: &[usize]) -> HostArray {
    let n: usize = shape.iter().product();
    let vals: Vec<f64> = (0..n).map(|i| i as f64).collect();
    array(dtype, shape, &vals)
}
