//! `ndfuse run MODEL.onnx`: an ONNX model on the chosen backend, its outputs written as
//! `.npy` files; and `ndfuse explain MODEL.onnx`: what the model compiles to.

use crate::explain::InputInfo;
use crate::failure::Failure;
use crate::inputs;
use ndfuse::{Array, Context, DType};
use ndfuse_onnx::{Model, Signature};
use std::io::Write as _;
use std::path::{Path, PathBuf};

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// The model (.onnx); external data files are read from its folder.
    model: PathBuf,
    /// A graph input read from a .npy file (names as the model spells them).
    #[arg(long = "input", value_name = "NAME=FILE.npy")]
    inputs: Vec<String>,
    /// Folder for the outputs: one DIR/<name>.npy per graph output (created if needed).
    #[arg(long = "output-dir", value_name = "DIR")]
    output_dir: PathBuf,
    /// Backend: auto picks the highest-priority one present.
    #[arg(long, value_enum, default_value_t = crate::choices::Backend::Auto)]
    backend: crate::choices::Backend,
    /// Print the evaluation's kernel count and time on stderr.
    #[arg(long)]
    verbose: bool,
}

/// Whether `ndfuse explain`'s argument names a model file rather than an expression.
pub fn is_model(arg: &str) -> bool {
    arg.ends_with(".onnx") && Path::new(arg).is_file()
}

fn load(path: &Path) -> Result<Model, Failure> {
    Model::load(path).map_err(|e| Failure::plain(e.to_string()))
}

/// `NAME=FILE` split at the first `=` (ONNX names may hold dots, colons and slashes).
fn named<'s>(flag: &str, spec: &'s str) -> Result<(&'s str, &'s str), Failure> {
    match spec.split_once('=') {
        Some((n, f)) if !n.is_empty() && !f.is_empty() => Ok((n, f)),
        _ => Err(Failure::plain(format!(
            "{flag} {spec}: expected NAME=VALUE"
        ))),
    }
}

fn describe(s: &Signature) -> String {
    let dims = match &s.dims {
        Some(d) => d
            .iter()
            .map(|d| d.map_or("?".to_string(), |n| n.to_string()))
            .collect::<Vec<_>>()
            .join(", "),
        None => "?".into(),
    };
    let dtype = s.dtype.map_or("?".to_string(), |d| d.to_string());
    format!("{} : {dtype}[{dims}]", s.name)
}

pub fn run_cmd(a: &RunArgs) -> Result<(), Failure> {
    let model = load(&a.model)?;
    let ctx = Context::builder()
        .backend(a.backend.into())
        .build()
        .map_err(|e| Failure::plain(e.reason()))?;
    let mut given: Vec<(String, Array)> = Vec::new();
    for spec in &a.inputs {
        let (name, file) = named("--input", spec)?;
        if given.iter().any(|(n, _)| n == name) {
            return Err(Failure::plain(format!(
                "input '{name}' is given more than once"
            )));
        }
        let arr = ndfuse::npy::read_npy(file).map_err(|e| {
            Failure::plain(format!(
                "--input {name}={file}: {}",
                inputs::file_reason(&e)
            ))
        })?;
        given.push((name.to_string(), arr));
    }
    let missing: Vec<String> = model
        .inputs()
        .iter()
        .filter(|s| !given.iter().any(|(n, _)| *n == s.name))
        .map(describe)
        .collect();
    if !missing.is_empty() {
        return Err(Failure::plain(format!(
            "{}: inputs not given (--input NAME=FILE.npy): {}",
            a.model.display(),
            missing.join("; ")
        )));
    }
    let start = std::time::Instant::now();
    let (outs, report) = model
        .run_report(&ctx, &given)
        .map_err(|e| Failure::plain(e.to_string()))?;
    let seconds = start.elapsed().as_secs_f64();
    std::fs::create_dir_all(&a.output_dir)
        .map_err(|e| Failure::plain(format!("--output-dir {}: {e}", a.output_dir.display())))?;
    let mut lines = String::new();
    for (name, arr) in &outs {
        let arr = if arr.dtype() == DType::BF16 {
            ctx.from_array(arr)
                .cast(DType::F32)
                .eval()
                .map_err(|e| Failure::plain(e.reason()))?
        } else {
            arr.clone()
        };
        let file = a.output_dir.join(format!("{}.npy", safe_name(name)));
        ndfuse::npy::write_npy(&file, &arr).map_err(|e| {
            Failure::plain(format!("{}: {}", file.display(), inputs::file_reason(&e)))
        })?;
        lines += &format!(
            "{} {}{:?} -> {}\n",
            name,
            arr.dtype(),
            arr.shape(),
            file.display()
        );
    }
    let _ = std::io::stdout().lock().write_all(lines.as_bytes());
    if a.verbose {
        eprintln!(
            "{} kernels, {:.1} ms (import, compile and run)",
            report.kernel_count(),
            seconds * 1e3
        );
    }
    Ok(())
}

/// An output name as a file name: characters other than letters, digits, `-`, `_` and
/// `.` become `_` (ONNX names may hold `/` and `:`).
fn safe_name(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() || s.starts_with('.') {
        format!("output{s}")
    } else {
        s
    }
}

/// `ndfuse explain MODEL.onnx [--shape NAME=SHAPE[:DTYPE]]...`: inputs with a fixed
/// declared shape need no `--shape`.
pub fn explain_model(path: &Path, shapes: &[String], ctx: &Context) -> Result<String, Failure> {
    let model = load(path)?;
    let mut given: Vec<(String, Array)> = Vec::new();
    let mut infos = Vec::new();
    for sig in model.inputs() {
        let spec = shapes
            .iter()
            .find(|s| s.split_once('=').is_some_and(|(n, _)| n == sig.name));
        let (dtype, dims) = match spec {
            Some(s) => {
                let rest = &s[sig.name.len() + 1..];
                let default = sig.dtype.unwrap_or(DType::F32);
                inputs::parse_shape_spec("--shape", s, rest, default)
                    .map(|(shape, d)| (d, shape))
                    .map_err(Failure::plain)?
            }
            None => match (&sig.dims, sig.dtype) {
                (Some(d), Some(t)) if d.iter().all(Option::is_some) => {
                    (t, d.iter().map(|d| d.unwrap_or(0)).collect())
                }
                _ => {
                    return Err(Failure::plain(format!(
                        "input {} has no fixed shape: give --shape {}=SHAPE[:DTYPE]",
                        describe(&sig),
                        sig.name
                    )))
                }
            },
        };
        let zeros = ctx
            .full_dtype(&dims, 0.0, dtype)
            .eval()
            .map_err(|e| Failure::plain(e.reason()))?;
        given.push((sig.name.clone(), zeros));
        infos.push(InputInfo {
            name: sig.name.clone(),
            dtype,
            shape: dims,
        });
    }
    let outs = model
        .build(ctx, &given)
        .map_err(|e| Failure::plain(e.to_string()))?;
    let mut s = format!("== model {} (opset {})\n", path.display(), model.opset());
    for (name, t) in &outs {
        s += &format!(
            "output {name} : {}{:?}\n",
            t.dtype().map(|d| d.to_string()).unwrap_or_default(),
            t.shape().unwrap_or(&[])
        );
    }
    s.push('\n');
    let tensors: Vec<&ndfuse::Tensor> = outs.iter().map(|(_, t)| t).collect();
    let mut head = String::from("== inputs\n");
    for (i, inp) in infos.iter().enumerate() {
        let dims: Vec<String> = inp.shape.iter().map(ToString::to_string).collect();
        head += &format!("in{i} = {} : {}[{}]\n", inp.name, inp.dtype, dims.join(","));
    }
    s += &head;
    s.push('\n');
    s += &ctx
        .explain(&tensors)
        .map_err(|e| Failure::plain(e.reason()))?;
    Ok(s)
}
