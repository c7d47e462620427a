//! Trains a character-level GPT on Debian's `fortunes` collections (`apt-get install
//! fortunes`; the offensive ones under `off/` are never read): 4 blocks of 4 heads,
//! d_model 128, context 128, GELU MLP, learned positions, a head tied to the token
//! embedding; batch 32, AdamW (lr 1e-3, betas 0.9/0.99, weight decay 0.1 on matrices
//! and embeddings only), linear warm-up over the first 5% of the steps then cosine decay
//! to 1e-4, gradients clipped to norm 1. Prints the training and validation loss in bits
//! per character, writes the curves (CSV and SVG) and samples 300 characters from the
//! trained model. `scripts/train_gpt_torch.py` is the same run in PyTorch.
//!
//! `cargo run --release -p ndfuse-nn --example train_gpt [-- --steps N --eval-every N
//! --eval-batches N --out DIR --sample N --temperature T --greedy --data DIR
//! --dtype f32|bf16|f16]` (default 2000 steps, about 0.6 s each on two cores; `--steps
//! 200` is a short run). `--dtype bf16` or `f16` trains in mixed precision: the
//! context's default dtype, so activations and products are half precision while the
//! parameters and AdamW's moments stay f32; f16 scales the loss dynamically and reports
//! the steps it skipped.
//! Steps come as an argument, not an `NDFUSE_*` variable: ndfuse's configuration refuses
//! `NDFUSE_*` variables that are not its keys. Files go to `DIR` (default `target/gpt`):
//! `loss.csv`, `loss.svg`, `sample.txt`.

use ndfuse::{Compiled, Context, DType, Tensor};
use ndfuse_nn::{
    cross_entropy_with_logits, plot_curves, CharCorpus, Curve, Gpt, GptConfig, Layer, Loss, Mode,
    Optimizer, Parameter, Progress, Schedule, Split, Trainer,
};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;

const USAGE: &str = "--steps N, --eval-every N, --eval-batches N, --out DIR, --sample N, \
                     --temperature T, --greedy, --data DIR, --dtype f32|bf16|f16";
const BATCH: usize = 32;
const CONTEXT: usize = 128;
/// The seeds of the training windows, the validation windows and the sampler.
const TRAIN_SEED: u64 = 1;
const VALIDATION_SEED: u64 = 2;
const SAMPLE_SEED: u64 = 3;

struct Args {
    steps: u64,
    eval_every: u64,
    eval_batches: u64,
    out: PathBuf,
    sample: usize,
    temperature: f64,
    greedy: bool,
    data: PathBuf,
    dtype: DType,
}

fn parse() -> Result<Args, Box<dyn std::error::Error>> {
    let mut a = Args {
        steps: 2000,
        eval_every: 0,
        eval_batches: 16,
        out: "target/gpt".into(),
        sample: 300,
        temperature: 0.8,
        greedy: false,
        data: CharCorpus::FORTUNES_DIR.into(),
        dtype: DType::F32,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--steps" => a.steps = value("--steps")?.parse()?,
            "--eval-every" => a.eval_every = value("--eval-every")?.parse()?,
            "--eval-batches" => a.eval_batches = value("--eval-batches")?.parse()?,
            "--out" => a.out = value("--out")?.into(),
            "--sample" => a.sample = value("--sample")?.parse()?,
            "--temperature" => a.temperature = value("--temperature")?.parse()?,
            "--greedy" => a.greedy = true,
            "--data" => a.data = value("--data")?.into(),
            "--dtype" => {
                a.dtype = match value("--dtype")?.as_str() {
                    "f32" => DType::F32,
                    "bf16" => DType::BF16,
                    "f16" => DType::F16,
                    other => return Err(format!("--dtype {other:?}: f32, bf16 or f16").into()),
                }
            }
            other => return Err(format!("unknown argument {other:?} ({USAGE})").into()),
        }
    }
    if a.steps == 0 {
        return Err("--steps must be at least 1".into());
    }
    if a.eval_every == 0 {
        a.eval_every = (a.steps / 8).max(1);
    }
    Ok(a)
}

/// The model's mean validation loss (nats per character) over `batches` fixed windows,
/// by a graph compiled once whose slots are the batch and the parameters.
struct Validation {
    step: Compiled,
    batches: Vec<(Tensor, Tensor)>,
}

impl Validation {
    fn new(
        ctx: &Context,
        model: &Gpt,
        corpus: &CharCorpus,
        batches: u64,
    ) -> Result<Validation, Box<dyn std::error::Error>> {
        let batches = (0..batches)
            .map(|i| {
                let (x, y) = corpus.batch(Split::Validation, BATCH, CONTEXT, VALIDATION_SEED, i)?;
                Ok((ctx.tensor(x), ctx.tensor(y)))
            })
            .collect::<Result<Vec<_>, ndfuse_nn::Error>>()?;
        let (x, y) = &batches[0];
        let loss = cross_entropy_with_logits(&model.forward(x, &Mode::eval()), y);
        let params = values(model);
        let inputs: Vec<&Tensor> = [x, y].into_iter().chain(&params).collect();
        Ok(Validation {
            step: ctx.compile(&[&loss], &inputs)?,
            batches,
        })
    }

    fn loss(&self, model: &Gpt) -> Result<f64, Box<dyn std::error::Error>> {
        let params = values(model);
        let mut total = 0.0;
        for (x, y) in &self.batches {
            let inputs: Vec<&Tensor> = [x, y].into_iter().chain(&params).collect();
            total += self.step.run(&inputs)?[0].to_f64_vec()[0];
        }
        Ok(total / self.batches.len() as f64)
    }
}

fn values(model: &Gpt) -> Vec<Tensor> {
    model.parameters().iter().map(Parameter::value).collect()
}

/// Nats to bits.
fn bits(nats: f64) -> f64 {
    nats / std::f64::consts::LN_2
}

/// SplitMix64: the sampler's uniform numbers in [0, 1).
struct Rng(u64);

impl Rng {
    fn uniform(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// `n` characters after `prompt`, each drawn from the softmax of the last position's
/// logits over `temperature` (the most likely one when `greedy`). The model always sees
/// a window of `CONTEXT` ids (the text so far, padded at the end with id 0: a causal
/// model's position `i` reads nothing after it), so one compiled graph serves every step.
fn sample(
    ctx: &Context,
    model: &Gpt,
    corpus: &CharCorpus,
    prompt: &str,
    n: usize,
    temperature: f64,
    greedy: bool,
) -> Result<String, Box<dyn std::error::Error>> {
    let mut ids = corpus.encode(prompt)?;
    let window = |ids: &[i64]| -> Result<(Tensor, usize), ndfuse::Error> {
        let from = ids.len().saturating_sub(CONTEXT);
        let mut w = ids[from..].to_vec();
        let last = w.len() - 1;
        w.resize(CONTEXT, 0);
        Ok((ctx.from_vec(w, &[1, CONTEXT])?, last))
    };
    let (x, _) = window(&ids)?;
    let logits = model.forward(&x, &Mode::eval());
    let params = values(model);
    let inputs: Vec<&Tensor> = std::iter::once(&x).chain(&params).collect();
    let step = ctx.compile(&[&logits], &inputs)?;
    let mut rng = Rng(SAMPLE_SEED);
    let v = corpus.vocab_size();
    for _ in 0..n {
        let (x, last) = window(&ids)?;
        let inputs: Vec<&Tensor> = std::iter::once(&x).chain(&params).collect();
        let out = step.run(&inputs)?;
        let row = &out[0].to_f64_vec()[last * v..(last + 1) * v];
        let next = if greedy || temperature <= 0.0 {
            (0..v).fold(0, |best, i| if row[i] > row[best] { i } else { best })
        } else {
            let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let p: Vec<f64> = row.iter().map(|l| ((l - m) / temperature).exp()).collect();
            let mut u = rng.uniform() * p.iter().sum::<f64>();
            p.iter()
                .position(|&pi| {
                    u -= pi;
                    u < 0.0
                })
                .unwrap_or(v - 1)
        };
        ids.push(next as i64);
    }
    Ok(corpus.decode(&ids))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse()?;
    let start = Instant::now();
    let ctx = Context::new();
    // Before the model is made: its parameters are then f32 master weights for a
    // half-precision model (see ndfuse_nn::Parameter::new).
    ctx.set_default_dtype(args.dtype)?;
    let corpus = CharCorpus::fortunes(&args.data)?;
    println!(
        "fortunes: {} files, {} characters ({} training, {} validation), vocabulary {} ({:.1} s to load)",
        corpus.files().len(),
        corpus.ids(Split::Train).len() + corpus.ids(Split::Validation).len(),
        corpus.ids(Split::Train).len(),
        corpus.ids(Split::Validation).len(),
        corpus.vocab_size(),
        start.elapsed().as_secs_f64()
    );
    let config = GptConfig {
        seed: 1,
        ..GptConfig::new(corpus.vocab_size(), CONTEXT, 128, 4, 4)
    };
    let model = Gpt::new(&ctx, &config)?;
    println!(
        "GPT: {} blocks, {} heads, d_model {}, context {}, {} parameters (head tied); computing in {}, parameters in {}",
        config.n_layers,
        config.n_heads,
        config.d_model,
        config.context,
        model.parameter_count(),
        args.dtype,
        Parameter::master_dtype(&ctx)
    );
    let warmup = (args.steps / 20).max(1);
    let schedule = Schedule::Cosine {
        base: 1e-3,
        floor: 1e-4,
        steps: args.steps.saturating_sub(warmup).max(1),
    }
    .with_warmup(warmup);
    let opt = Optimizer::adamw(&model.parameters(), 1e-3, 0.1)
        .betas(0.9, 0.99)
        .no_decay(|p| p.shape().len() < 2)
        .clip_grad_norm(1.0)
        .schedule(schedule);
    let mut trainer = Trainer::new(model, opt, Loss::CrossEntropy)?.seed(TRAIN_SEED);
    let validation = Validation::new(&ctx, trainer.model(), &corpus, args.eval_batches)?;
    let initial = validation.loss(trainer.model())?;
    println!(
        "step 0: validation {:.3} bits/char (uniform: {:.3})",
        bits(initial),
        (corpus.vocab_size() as f64).log2()
    );

    std::fs::create_dir_all(&args.out)?;
    let bar = Progress::new(args.steps, "gpt");
    let (mut train_curve, mut val_curve) = (Vec::new(), vec![(0.0, bits(initial))]);
    let mut csv = String::from("step,train_bits_per_char,validation_bits_per_char\n");
    let mut window_loss = (0.0, 0u64);
    let train_start = Instant::now();
    let mut after_first = None;
    for step in 0..args.steps {
        let (x, y) = corpus.batch(Split::Train, BATCH, CONTEXT, TRAIN_SEED, step)?;
        let loss = bits(trainer.step(&x, &y)?);
        if step == 0 {
            after_first = Some(Instant::now());
        }
        window_loss = (window_loss.0 + loss, window_loss.1 + 1);
        let done = step + 1;
        train_curve.push((done as f64, loss));
        let secs = train_start.elapsed().as_secs_f64();
        let rate = (done as usize * BATCH * CONTEXT) as f64 / secs.max(1e-9);
        match trainer.optimizer().loss_scaler() {
            Some(s) => bar.update_scaled(done, loss, rate, s.scale(), s.skipped_steps()),
            None => bar.update(done, loss, rate),
        }
        let mut val = String::new();
        if done % args.eval_every == 0 || done == args.steps {
            let v = bits(validation.loss(trainer.model())?);
            val_curve.push((done as f64, v));
            val = format!("{v:.5}");
            let line = format!(
                "step {done}: train {:.3} bits/char (mean of the last {} steps), validation {v:.3}, lr {:.2e}, {:.1} s",
                window_loss.0 / window_loss.1 as f64,
                window_loss.1,
                trainer.optimizer().rate(),
                secs
            );
            if bar.is_hidden() {
                println!("{line}");
            } else {
                bar.message(&line);
            }
            window_loss = (0.0, 0);
        }
        writeln!(csv, "{done},{loss:.5},{val}")?;
    }
    let total = train_start.elapsed().as_secs_f64();
    let steady = after_first.map_or(0.0, |t| t.elapsed().as_secs_f64());
    let per_step = steady / (args.steps - 1).max(1) as f64;
    let last_val = val_curve.last().map_or(f64::NAN, |v| v.1);
    bar.finish(&format!("validation {last_val:.3} bits/char"));
    println!(
        "trained {} steps in {total:.1} s: {:.3} s/step after the first (which compiles: {:.1} s); final validation {last_val:.3} bits/char",
        args.steps,
        per_step,
        total - steady,
    );
    if let Some(s) = trainer.optimizer().loss_scaler() {
        println!(
            "loss scaling: {} of {} steps skipped (a gradient overflowed f16), final scale {}",
            s.skipped_steps(),
            args.steps,
            s.scale()
        );
    }
    let csv_path = args.out.join("loss.csv");
    std::fs::write(&csv_path, csv)?;
    let svg = args.out.join("loss.svg");
    plot_curves(
        &svg,
        "char-level GPT on fortunes (4x4x128, ctx 128, AdamW 1e-3)",
        "step",
        &[(
            "bits per character",
            &[
                Curve::new("training", train_curve),
                Curve::new("validation", val_curve),
            ],
        )],
    )?;
    println!(
        "curves written to {} and {}",
        csv_path.display(),
        svg.display()
    );

    let text = sample(
        &ctx,
        trainer.model(),
        &corpus,
        "\n",
        args.sample,
        args.temperature,
        args.greedy,
    )?;
    std::fs::write(args.out.join("sample.txt"), &text)?;
    let how = if args.greedy {
        "greedy".to_string()
    } else {
        format!("temperature {}", args.temperature)
    };
    println!(
        "--- {} sampled characters ({how}) ---{text}\n---",
        args.sample
    );
    Ok(())
}
