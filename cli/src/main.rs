//! `ndfuse`: evaluate and explain numpy-like array expressions from the shell.
//!
//! ```text
//! ndfuse eval 'sum(exp(a * b + 1), axis=1)' --random a=4x8 --random b=8 --report json
//! ndfuse explain 'softmax(x, axis=-1)' --shape x=4096x4096
//! ndfuse bench softmax --json
//! ndfuse backends
//! ndfuse generate --model SmolLM2-135M-Instruct.Q4_1.gguf --prompt 'The capital of France is'
//! ndfuse embed --model all-minilm-l6-v2 --text 'A sentence.' --json
//! ```
//!
//! Every failure prints one line on stderr and exits non-zero: 2 for a command line
//! clap rejects, 1 for everything else (a bad expression, input, file or evaluation).
//! No output file is written unless the whole evaluation succeeded.

mod bench;
mod choices;
mod explain;
mod failure;
mod inputs;
mod models;
mod onnx;
mod report;
mod show;

use choices::{Backend, FloatDType};
use clap::{Parser, Subcommand, ValueEnum};
use failure::Failure;
use ndfuse::{Context, DType, Expr, Tensor};
use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "ndfuse",
    version,
    about = "Evaluate and explain lazy array expressions compiled into fused kernels",
    after_help = "EXPR is numpy-like: input names, literals (2, 1.5, 1e-5, true), + - * / **, \
unary -, < <= > >= == !=, parentheses, calls such as exp(x), maximum(a, b), where(c, a, b), \
cast(x, f16), sum(x, axis=1, keepdims=true), reshape(x, [2, -1]), transpose(x, [1, 0]), \
softmax(x, axis=-1), layernorm(x, axis=-1, eps=1e-5), and slices x[1:9:2, :], x[::-1].\n\
SHAPE is dims joined by x (4096x4096); an empty SHAPE is a scalar. DTYPE is one of f16 bf16 f32 f64 i32 i64 bool."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Evaluate EXPR and print the result (or a JSON report).
    Eval(EvalArgs),
    /// Show what EXPR compiles to (graph, schedule, kernels, generated code) without
    /// running it.
    Explain(ExplainArgs),
    /// Run the built-in benchmark suite: median time, GB/s and the fraction of this
    /// machine's memory bandwidth (measured in the same run) of each case.
    Bench(bench::BenchArgs),
    /// List the backends compiled into this build and which one `auto` picks.
    Backends,
    /// Generate text with a pretrained Llama-architecture model from a GGUF file.
    Generate(models::GenerateArgs),
    /// Print the sentence embeddings of texts with a pretrained BERT model.
    Embed(models::EmbedArgs),
    /// Run an ONNX model: each graph output written as DIR/<name>.npy.
    Run(onnx::RunArgs),
}

#[derive(clap::Args, Debug)]
struct EvalArgs {
    /// The expression, e.g. 'sum(exp(x), axis=1)'.
    #[arg(allow_hyphen_values = true)]
    expr: String,
    /// An input read from a .npy file (f16, f32, f64, i32, i64, bool; C or Fortran order).
    #[arg(long = "input", value_name = "NAME=FILE.npy")]
    inputs: Vec<String>,
    /// A random input: floats uniform in [-1, 1), ints in [-10, 10), bools fair.
    /// DTYPE defaults to --dtype.
    #[arg(long = "random", value_name = "NAME=SHAPE[:DTYPE]")]
    random: Vec<String>,
    /// Seed of the random inputs (each input derives its own stream from it and its name).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Write the result to this .npy file (atomically: complete or not at all).
    #[arg(long, value_name = "FILE.npy")]
    output: Option<PathBuf>,
    #[command(flatten)]
    common: Common,
    /// Evaluate this many times (the report gives the median time).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    repeat: u32,
    /// Print a report instead of the result.
    #[arg(long, value_enum)]
    report: Option<ReportFormat>,
}

#[derive(clap::Args, Debug)]
struct ExplainArgs {
    /// The expression, or an ONNX model file (MODEL.onnx).
    #[arg(allow_hyphen_values = true)]
    expr: String,
    /// The shape and dtype of an input (DTYPE defaults to --dtype). Nothing is
    /// evaluated: the inputs only give the graph its types.
    #[arg(long = "shape", value_name = "NAME=SHAPE[:DTYPE]")]
    shapes: Vec<String>,
    #[command(flatten)]
    common: Common,
}

#[derive(clap::Args, Debug)]
struct Common {
    /// Backend: auto picks the highest-priority one present (a GPU when there is one).
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    backend: Backend,
    /// Default dtype of float literals and of --random / --shape inputs without one.
    #[arg(long, value_enum, default_value_t = FloatDType::F32)]
    dtype: FloatDType,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum ReportFormat {
    Json,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                let _ = e.print();
                return ExitCode::from(2);
            }
            eprintln!("{}", one_line(&e.render().to_string()));
            return ExitCode::from(2);
        }
    };
    let result = match cli.command {
        Command::Eval(a) => eval(&a),
        Command::Explain(a) => explain_cmd(&a),
        Command::Backends => backends(),
        Command::Bench(a) => bench::run(&a),
        Command::Generate(a) => models::generate_cmd(&a),
        Command::Embed(a) => models::embed_cmd(&a),
        Command::Run(a) => onnx::run_cmd(&a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure(line)) => {
            eprintln!("{line}");
            ExitCode::FAILURE
        }
    }
}

/// clap's multi-line error as one line: its first paragraph (the message, and the
/// missing arguments or possible values when it lists them), lines joined.
fn one_line(rendered: &str) -> String {
    let para: Vec<&str> = rendered
        .lines()
        .map(str::trim)
        .skip_while(|l| l.is_empty())
        .take_while(|l| !l.is_empty())
        .collect();
    let mut out = if para.is_empty() {
        "error: bad command line".to_string()
    } else {
        para.join(" ")
    };
    out.push_str(" (see ndfuse --help)");
    out
}

fn context(c: &Common) -> Result<Context, Failure> {
    Context::builder()
        .dtype(c.dtype.into())
        .backend(c.backend.into())
        .build()
        .map_err(|e| Failure::plain(e.reason()))
}

fn insert_input(
    map: &mut BTreeMap<String, Tensor>,
    name: String,
    t: Tensor,
) -> Result<(), Failure> {
    if map.contains_key(&name) {
        return Err(Failure::plain(format!(
            "input '{name}' is given more than once"
        )));
    }
    map.insert(name, t);
    Ok(())
}

fn eval(a: &EvalArgs) -> Result<(), Failure> {
    let ctx = context(&a.common)?;
    let expr = Expr::parse(&a.expr).map_err(Failure::parse)?;
    let mut named = BTreeMap::new();
    for spec in &a.inputs {
        let (name, t) = inputs::load_npy(&ctx, spec)?;
        insert_input(&mut named, name, t)?;
    }
    for spec in &a.random {
        let (name, t) = inputs::random(&ctx, spec, a.seed)?;
        insert_input(&mut named, name, t)?;
    }
    let out = expr
        .bind_named(&ctx, &named, "--input NAME=FILE.npy or --random NAME=SHAPE")
        .map_err(|e| Failure::expr(&a.expr, &e))?
        .tensor;
    if a.output.is_some() && out.dtype().ok() == Some(DType::BF16) {
        // Refused before evaluating, so that a long run does not end in this error.
        return Err(Failure::plain(
            "--output: numpy has no bf16 dtype, so a bf16 result cannot be written to .npy: wrap the expression in cast(..., f32)",
        ));
    }
    let mut runs = Vec::with_capacity(a.repeat as usize);
    let mut result = None;
    for _ in 0..a.repeat {
        let (mut arrays, rep) = ctx
            .eval_report(&[&out])
            .map_err(|e| Failure::plain(format!("evaluation failed: {}", e.reason())))?;
        result = arrays.pop();
        runs.push(rep);
    }
    let result = result.expect("--repeat is at least 1 (clap checks it), so one evaluation ran");
    if let Some(path) = &a.output {
        ndfuse::npy::write_npy(path, &result).map_err(|e| {
            Failure::plain(format!(
                "--output {}: {}",
                path.display(),
                inputs::file_reason(&e)
            ))
        })?;
    }
    let text = match a.report {
        Some(ReportFormat::Json) => format!("{}\n", report::json(&runs)),
        None => show::render(&result),
    };
    // A closed stdout (`| head`) is not worth a panic.
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
    Ok(())
}

fn explain_cmd(a: &ExplainArgs) -> Result<(), Failure> {
    let ctx = context(&a.common)?;
    if onnx::is_model(&a.expr) {
        let text = onnx::explain_model(std::path::Path::new(&a.expr), &a.shapes, &ctx)?;
        let _ = std::io::stdout().lock().write_all(text.as_bytes());
        return Ok(());
    }
    let expr = Expr::parse(&a.expr).map_err(Failure::parse)?;
    let mut named = BTreeMap::new();
    let mut types = BTreeMap::new();
    for spec in &a.shapes {
        let (name, t, dtype, shape) = inputs::zeros(&ctx, spec)?;
        types.insert(name.clone(), (dtype, shape));
        insert_input(&mut named, name, t)?;
    }
    let bound = expr
        .bind_named(&ctx, &named, "--shape NAME=SHAPE[:DTYPE]")
        .map_err(|e| Failure::expr(&a.expr, &e))?;
    let out = bound.tensor;
    let infos: Vec<explain::InputInfo> = bound
        .used
        .iter()
        .filter_map(|n| {
            types.get(n).map(|(dtype, shape)| explain::InputInfo {
                name: n.clone(),
                dtype: *dtype,
                shape: shape.clone(),
            })
        })
        .collect();
    let text = explain::explain(&ctx, &out, &infos)?;
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
    Ok(())
}

/// The compiled-code caches' counters under `cfg`'s limits (a fresh process has
/// compiled nothing, so they show the limits in force), one cache a line.
fn code_caches(cfg: &ndfuse_runtime::Config) -> String {
    let mut s = ndfuse_runtime::compile_cache_stats();
    let kernels = ndfuse_runtime::CodeCacheLimits::kernels(cfg);
    let graphs = ndfuse_runtime::CodeCacheLimits::graphs(cfg);
    (s.kernels.max_entries, s.kernels.max_bytes) = (kernels.entries, kernels.bytes);
    (s.graphs.max_entries, s.graphs.max_bytes) = (graphs.entries, graphs.bytes);
    format!("  CPU kernels: {}\n  graphs:      {}", s.kernels, s.graphs)
}

fn backends() -> Result<(), Failure> {
    // What was found and rejected (with the reason), the priorities, what `auto` picks,
    // and every effective configuration value with where it came from.
    let cfg = ndfuse_runtime::Config::load().map_err(|e| Failure::plain(e.to_string()))?;
    let registry = ndfuse_runtime::Registry::discover(&cfg);
    let auto = match ndfuse_runtime::choose(&cfg, None) {
        Ok(kind) => kind.name().to_string(),
        Err(e) => format!("nothing can run: {e}"),
    };
    // The host cache of this process, under this configuration's limits: a fresh
    // process has evaluated nothing, so the counters show the limits in force more than
    // any traffic.
    let cache = ndfuse_runtime::host_cache();
    cache.set_limits(ndfuse_runtime::Limits::host(&cfg));
    // The device set evaluations are placed on (batches, bound threads,
    // allow_multi_gpu): every GPU found, then the host.
    let devices = match ndfuse_runtime::DeviceSet::discover(&cfg, 1) {
        Ok(set) => set.to_string(),
        Err(e) => format!("(none: {e})\n"),
    };
    let text = format!(
        "backends compiled into this build:\n{registry}\nauto picks: {auto}\n\n\
         devices, in placement order (allow_multi_gpu = {}):\n{devices}\n\
         host buffer cache: {}\n\n\
         compiled-code caches (this process):\n{}\n\n\
         configuration (effective value, then where it came from):\n{}",
        cfg.allow_multi_gpu(),
        cache.stats(),
        code_caches(&cfg),
        cfg.explain()
    );
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
    Ok(())
}
