//! Parameters: named tensors whose storage persists across steps. A layer and the
//! optimiser share a [`Parameter`]; a training step reads its current value as a leaf
//! of the step's graph and [`Parameter::replace`]s it with the evaluated new value,
//! which moves the array in (no copy). The buffer the old value held goes back to the
//! host cache and serves the next step's new value, so after the first step a step
//! allocates nothing (the cache's hit counter shows it).

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
    /// A parameter holding `value`, evaluated now when it is an expression.
    pub fn new(name: impl Into<String>, value: &Tensor) -> Result<Parameter> {
        let ctx = value.context().clone();
        let data = value.eval()?;
        Ok(Parameter(Arc::new(Slot {
            name: name.into(),
            value: RwLock::new(ctx.tensor(data)),
        })))
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
