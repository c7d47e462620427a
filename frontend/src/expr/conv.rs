//! Convolutions, pooling and batch normalisation in expressions, PyTorch's spellings
//! and argument orders: `conv1d`, `conv2d`, `conv_transpose1d`, `conv_transpose2d`,
//! `max_pool2d`, `avg_pool2d`, `global_avg_pool2d` and `batch_norm`.

use super::call::{bind, bool_literal, conv_padding, float_literal, opt, req, spatial_literal};
use super::lower::count_literal;
use super::parse::{ExprError, Kwarg, Node};
use crate::tensor::Tensor;

impl super::lower::Lowerer<'_> {
    /// PyTorch's `conv1d` / `conv2d(input, weight, bias, stride=1, padding=0,
    /// dilation=1, groups=1)`, `conv_transpose1d` / `conv_transpose2d(input, weight,
    /// bias, stride=1, padding=0, output_padding=0, groups=1, dilation=1)`, `max_pool2d(input, kernel_size, stride=None, padding=0,
    /// dilation=1)`, `avg_pool2d(input, kernel_size, stride=None, padding=0,
    /// count_include_pad=True)` and `global_avg_pool2d(input)`; out of
    /// [`Lowerer::call`] and never inlined, as [`Lowerer::index_call`].
    #[inline(never)]
    pub(super) fn conv_call(
        &mut self,
        name: &str,
        args: &[Node],
        kwargs: &[Kwarg],
        pos: usize,
    ) -> Result<Tensor, ExprError> {
        if name == "batch_norm" {
            // batch_norm(input, running_mean=None, running_var=None, weight=None,
            // bias=None, training=False, momentum=0.1, eps=1e-05): the output (the
            // running statistics' update is `Tensor::batch_norm_running`).
            let a = bind(
                name,
                pos,
                args,
                kwargs,
                &[
                    "input",
                    "running_mean=None",
                    "running_var=None",
                    "weight=None",
                    "bias=None",
                    "training=False",
                    "momentum=0.1",
                    "eps=1e-05",
                ],
            )?;
            let x = self.tensor_arg(req(&a, 0))?;
            let mut per_channel = Vec::with_capacity(4);
            for i in 1..5 {
                per_channel.push(opt(&a, i).map(|n| self.tensor_arg(n)).transpose()?);
            }
            let mut bn = crate::batch_norm::BatchNorm::new();
            if let Some(n) = opt(&a, 5) {
                bn = bn.training(bool_literal(n)?);
            }
            if let Some(n) = opt(&a, 6) {
                bn = bn.momentum(float_literal(n, "momentum")?);
            }
            if let Some(n) = opt(&a, 7) {
                bn = bn.eps(float_literal(n, "eps")?);
            }
            let [m, v, w, b] = &per_channel[..] else {
                unreachable!("four per-channel slots")
            };
            return Ok(x.batch_norm(m.as_ref(), v.as_ref(), w.as_ref(), b.as_ref(), &bn));
        }
        if name == "global_avg_pool2d" {
            let a = bind(name, pos, args, kwargs, &["input"])?;
            return Ok(self.tensor_arg(req(&a, 0))?.global_avg_pool2d());
        }
        if !name.starts_with("conv") {
            let last = if name == "max_pool2d" {
                "dilation=1"
            } else {
                "count_include_pad=True"
            };
            let a = bind(
                name,
                pos,
                args,
                kwargs,
                &["input", "kernel_size", "stride=None", "padding=0", last],
            )?;
            let x = self.tensor_arg(req(&a, 0))?;
            let kernel = spatial_literal(req(&a, 1), "kernel_size", 1)?;
            let mut pool = crate::conv::Pool::new(crate::conv::Spatial(kernel));
            if let Some(n) = opt(&a, 2) {
                pool = pool.stride(crate::conv::Spatial(spatial_literal(n, "stride", 1)?));
            }
            if let Some(n) = opt(&a, 3) {
                pool = pool.padding(crate::conv::Spatial(spatial_literal(n, "padding", 0)?));
            }
            return Ok(if name == "max_pool2d" {
                if let Some(n) = opt(&a, 4) {
                    pool = pool.dilation(crate::conv::Spatial(spatial_literal(n, "dilation", 1)?));
                }
                x.max_pool2d(&pool)
            } else {
                if let Some(n) = opt(&a, 4) {
                    pool = pool.count_include_pad(bool_literal(n)?);
                }
                x.avg_pool2d(&pool)
            });
        }
        let transposed = name.starts_with("conv_transpose");
        // PyTorch's orders: conv2d(input, weight, bias, stride, padding, dilation,
        // groups); conv_transpose2d(input, weight, bias, stride, padding,
        // output_padding, groups, dilation).
        let params: &[&str] = if transposed {
            &[
                "input",
                "weight",
                "bias=None",
                "stride=1",
                "padding=0",
                "output_padding=0",
                "groups=1",
                "dilation=1",
            ]
        } else {
            &[
                "input",
                "weight",
                "bias=None",
                "stride=1",
                "padding=0",
                "dilation=1",
                "groups=1",
            ]
        };
        let a = bind(name, pos, args, kwargs, params)?;
        let (dilation, groups) = if transposed { (7, 6) } else { (5, 6) };
        let x = self.tensor_arg(req(&a, 0))?;
        let w = self.tensor_arg(req(&a, 1))?;
        let b = opt(&a, 2).map(|n| self.tensor_arg(n)).transpose()?;
        let mut conv = crate::conv::Conv::new();
        if let Some(n) = opt(&a, 3) {
            conv = conv.stride(crate::conv::Spatial(spatial_literal(n, "stride", 1)?));
        }
        if let Some(n) = opt(&a, 4) {
            conv = conv.padding(conv_padding(n)?);
        }
        if let Some(n) = opt(&a, dilation) {
            conv = conv.dilation(crate::conv::Spatial(spatial_literal(n, "dilation", 1)?));
        }
        if let Some(n) = opt(&a, groups) {
            conv = conv.groups(count_literal(n, "groups")?);
        }
        if let (true, Some(n)) = (transposed, opt(&a, 5)) {
            conv = conv.output_padding(crate::conv::Spatial(spatial_literal(
                n,
                "output_padding",
                0,
            )?));
        }
        Ok(match name {
            "conv1d" => x.conv1d(&w, b.as_ref(), &conv),
            "conv2d" => x.conv2d(&w, b.as_ref(), &conv),
            "conv_transpose1d" => x.conv_transpose1d(&w, b.as_ref(), &conv),
            _ => x.conv_transpose2d(&w, b.as_ref(), &conv),
        })
    }
}
