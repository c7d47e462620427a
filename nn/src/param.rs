//! Parameters: named tensors whose storage persists across steps. A layer and the
//! optimiser share a [`Parameter`]; a training step reads its current value as a leaf
//! of the step's graph and [`Parameter::replace`]s it with the evaluated new value,
//! which moves the array in (no copy). The buffer the old value held goes back to the
//! host cache and serves the next step's new value, so after the first step a step
//! allocates nothing (the cache's hit counter shows it).
//!
//! Mixed precision: in a context whose default dtype is f16 or bf16, parameters are
//! master weights held in f32 (and so is the optimiser's state), while layers compute
//! in the half dtype: [`Parameter::value_like`] is the value cast to the activations'
//! dtype, a cast in the graph, so the gradient comes back through the cast in f32.

use crate::error::{Error, Result};
use ndfuse::{Array, Context, DType, Tensor};
use std::sync::{Arc, RwLock};

#[derive(Debug)]
struct Slot {
    name: String,
    value: RwLock<Tensor>,
}

/// A named trainable tensor, shared (cloning shares it) between a layer and the
/// optimiser. Its value is always data (a leaf), never an expression.
#[derive(Debug, Clone)]
pub struct Parameter(Arc<Slot>);

impl Parameter {
    /// A parameter holding `value`, evaluated now when it is an expression. In a
    /// context whose default dtype is f16 or bf16, an f16 or bf16 value is held in f32
    /// (master weights for mixed-precision training: see [`Parameter::master_dtype`]);
    /// [`Parameter::exact`] keeps the value's dtype whatever it is.
    ///
    /// ```
    /// use ndfuse::DType;
    /// use ndfuse_nn::Parameter;
    /// let ctx = ndfuse::Context::builder().dtype(DType::BF16).build()?;
    /// let w = Parameter::new("w", &ctx.ones(&[2, 3]))?;
    /// assert_eq!(w.dtype(), DType::F32);
    /// assert_eq!(Parameter::exact("h", &ctx.ones(&[2]))?.dtype(), DType::BF16);
    /// # Ok::<(), ndfuse_nn::Error>(())
    /// ```
    pub fn new(name: impl Into<String>, value: &Tensor) -> Result<Parameter> {
        let master = Parameter::master_dtype(value.context());
        match value.dtype()? {
            d if d.is_half() && d != master => Parameter::exact(name, &value.cast(master)),
            _ => Parameter::exact(name, value),
        }
    }

    /// A parameter holding `value` in its own dtype (a half-precision value stays half:
    /// training without f32 master weights), evaluated now when it is an expression.
    pub fn exact(name: impl Into<String>, value: &Tensor) -> Result<Parameter> {
        let ctx = value.context().clone();
        let data = value.eval()?;
        Ok(Parameter(Arc::new(Slot {
            name: name.into(),
            value: RwLock::new(ctx.tensor(data)),
        })))
    }

    /// The dtype parameters made in `ctx` are kept in: f32 when its default dtype is
    /// f16 or bf16 (master weights: an update far smaller than the weight, as most are,
    /// would round away in 8 or 11 bits of mantissa), else the default dtype.
    pub fn master_dtype(ctx: &Context) -> DType {
        match ctx.default_dtype() {
            d if d.is_half() => DType::F32,
            d => d,
        }
    }

    /// The value as a layer reads it for the input `x`: cast to `x`'s dtype when that is
    /// f16 or bf16 and differs from the parameter's (the layer computes in its
    /// activations' dtype; the cast is part of the graph, so the parameter's gradient
    /// comes back through it in the parameter's dtype), else the value itself.
    pub fn value_like(&self, x: &Tensor) -> Tensor {
        let v = self.value();
        match (x.dtype(), v.dtype()) {
            (Ok(d), Ok(own)) if d.is_half() && d != own => v.cast(d),
            _ => v,
        }
    }

    /// The name (unique within a model; checkpoints key on it).
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// The current value: a leaf tensor (cheap: a reference count).
    pub fn value(&self) -> Tensor {
        self.0
            .value
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The shape.
    pub fn shape(&self) -> Vec<usize> {
        self.value()
            .shape()
            .map(<[usize]>::to_vec)
            .unwrap_or_default()
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.value().dtype().unwrap_or(DType::F32)
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.shape().iter().product()
    }

    /// Replaces the value with `data`, moved in; `Err` naming both shapes (or dtypes)
    /// when they differ from the parameter's, and then the value is untouched.
    pub fn replace(&self, data: Array) -> Result<()> {
        let (shape, dtype) = (self.shape(), self.dtype());
        if data.shape() != shape.as_slice() || data.dtype() != dtype {
            return Err(Error::Argument {
                what: "Parameter::replace",
                why: format!(
                    "parameter `{}` is {dtype}{shape:?}; the new value is {}{:?}",
                    self.name(),
                    data.dtype(),
                    data.shape()
                ),
            });
        }
        let ctx: Context = self.value().context().clone();
        *self
            .0
            .value
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = ctx.tensor(data);
        Ok(())
    }

    /// The current value evaluated (its data: a copy into a new array).
    pub fn array(&self) -> Result<Array> {
        Ok(self.value().eval()?)
    }

    /// A new parameter of the same name whose value starts as this one's current value
    /// (shared data: values are replaced, never written into).
    pub fn duplicate(&self) -> Parameter {
        Parameter(Arc::new(Slot {
            name: self.0.name.clone(),
            value: RwLock::new(self.value()),
        }))
    }

    /// Sets the value to `value`, a data tensor (shared, not copied), as data-parallel
    /// training does to hand averaged values to every replica. `Err` naming both types
    /// when the shape or dtype differs, or when `value` is an expression.
    pub fn share(&self, value: &Tensor) -> Result<()> {
        let (shape, dtype) = (self.shape(), self.dtype());
        let ok = value.shape().ok() == Some(shape.as_slice()) && value.dtype().ok() == Some(dtype);
        if !ok || !value.is_data() {
            return Err(Error::Argument {
                what: "Parameter::share",
                why: format!(
                    "parameter `{}` is {dtype}{shape:?}; the value is {:?}{:?}{}",
                    self.name(),
                    value.dtype().ok(),
                    value.shape().ok(),
                    if value.is_data() {
                        ""
                    } else {
                        " (an expression, not data)"
                    }
                ),
            });
        }
        *self
            .0
            .value
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = value.clone();
        Ok(())
    }

    /// Whether `self` and `other` are the same parameter (not merely equal values).
    pub fn same(&self, other: &Parameter) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}
