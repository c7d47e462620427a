//! # ndfuse-passes
//!
//! Turns a verified graph into a [`Schedule`]: the fewest kernels the fusion rules
//! allow, each a [`ndfuse_ir::Kernel`] description (with its parallel plan) that every
//! codegen consumes as is. Clean-up passes run first under the pass manager
//! ([`optimize`]); fusion (`fusion/`, with its rules) and plan choice (`plan.rs`) then
//! lower the graph.

pub mod attention;
pub mod cse;
pub mod dce;
pub mod fold;
pub mod fusion;
pub mod gather_views;
pub mod manager;
pub mod pass;
pub mod pipeline;
mod rewrite;
pub mod schedule;
pub mod simplify;
pub mod sink_reshapes;
pub mod views;

pub use attention::{fuse_attention, FuseAttention};
pub use cse::Cse;
pub use dce::Dce;
pub use fold::Fold;
pub use fusion::{schedule, schedule_for, schedule_with};
pub mod plan;
pub use manager::{PassLog, PassManager, PassOptions, PassRecord, PassStatus, LATER_STAGES};
pub use pass::{Pass, PassCx, PassError};
pub use pipeline::{optimize, pipeline};
pub use plan::TargetDesc;
pub use schedule::{Placement, Schedule, Step};
pub use simplify::Simplify;
pub use sink_reshapes::SinkReshapes;
pub use views::Views;
