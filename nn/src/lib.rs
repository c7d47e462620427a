//! # ndfuse-nn
//!
//! Training on ndfuse tensors: layers, losses, optimisers whose steps compile into fused
//! kernels, seeded data sets with a prefetch thread, `safetensors` checkpoints and a
//! training loop with a progress bar and loss curves; transformer layers, a GPT and a
//! character-level text corpus.
//!
//! Mixed precision: in a context whose default dtype is bf16 or f16
//! (`ctx.set_default_dtype(DType::BF16)` before the model is made), parameters and the
//! optimiser's state are f32 master copies while layers compute in the half dtype;
//! normalisation statistics and losses are taken in f32; in f16 the optimiser scales
//! the loss dynamically and skips steps whose gradients overflow ([`LossScale`]).

mod checkpoint;
mod conv_layers;
mod data;
mod error;
mod fit;
mod gpt;
mod idx;
mod init;
mod layers;
mod loss;
mod loss_scale;
mod optim;
mod param;
mod plot;
mod progress;
mod schedule;
mod text;
mod train;
mod transformer;

pub use checkpoint::{load as load_checkpoint, save as save_checkpoint, Checkpoint};
pub use conv_layers::{
    AvgPool2d, BatchNorm2d, Conv1d, Conv2d, ConvTranspose2d, Flatten, GlobalAvgPool, MaxPool2d,
};
pub use data::{Batch, Batches, Dataset, Prefetch};
pub use error::{Error, Result};
pub use fit::{epoch_line, Epoch, FitOptions, History};
pub use gpt::{Gpt, GptConfig, Positions};
pub use idx::{parse_idx, read_idx, FashionMnist, Idx, IdxValues};
pub use init::Init;
pub use layers::{
    autocast, in_f32, Activation, Dropout, Layer, LayerNorm, Linear, Mode, QuantLinear, Sequential,
};
pub use loss::{accuracy, cross_entropy_with_logits, mse};
pub use loss_scale::LossScale;
pub use optim::{clip_grad_norm, Gradients, Method, Optimizer, Update};
pub use param::Parameter;
pub use plot::{plot_curves, Curve};
pub use progress::Progress;
pub use schedule::Schedule;
pub use text::{CharCorpus, Split};
pub use train::{Loss, Scores, Trainer};
pub use transformer::{
    Angles, AttentionConfig, BlockConfig, Embedding, FeedForward, FeedForwardKind,
    MultiHeadAttention, NormKind, PositionEmbedding, RmsNorm, Rope, RopeLayout, TransformerBlock,
};
