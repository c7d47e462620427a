//! Printing an evaluated array for a person: a `dtype[shape]` line, then the values
//! nested in brackets and right-aligned, with numpy's summarisation of big arrays
//! (more than 1000 elements: the first and last 3 along every axis, `...` between).

use half::{bf16, f16};
use ndfuse::Array;
use ndfuse_ir::Storage;

/// numpy's `threshold` and `edgeitems` print options.
const THRESHOLD: usize = 1000;
const EDGE: usize = 3;

/// Element `i` as text, in the shortest form that reads back to the same value of the
/// array's own dtype (`0.1` for an f32 0.1, not its f64 widening).
fn element(s: &Storage, i: usize) -> String {
    fn float(v: f64, text: String) -> String {
        if v.is_nan() {
            "nan".into()
        } else if v.is_infinite() {
            if v > 0.0 { "inf" } else { "-inf" }.into()
        } else {
            text
        }
    }
    match s {
        Storage::F16(v) => float(
            v[i].to_f64(),
            shortest(v[i].to_f64(), |x| f16::from_f64(x) == v[i]),
        ),
        Storage::BF16(v) => float(
            v[i].to_f64(),
            shortest(v[i].to_f64(), |x| bf16::from_f64(x) == v[i]),
        ),
        Storage::F32(v) => float(f64::from(v[i]), format!("{:?}", v[i])),
        Storage::F64(v) => float(v[i], format!("{:?}", v[i])),
        Storage::I32(v) => v[i].to_string(),
        Storage::I64(v) => v[i].to_string(),
        Storage::Bool(v) => v[i].to_string(),
    }
}

/// The indices shown along an axis of extent `n`: all, or the edges with a gap.
fn shown(n: usize, summarise: bool) -> Vec<Option<usize>> {
    if summarise && n > 2 * EDGE {
        (0..EDGE)
            .map(Some)
            .chain(std::iter::once(None))
            .chain((n - EDGE..n).map(Some))
            .collect()
    } else {
        (0..n).map(Some).collect()
    }
}

/// The shortest decimal that `same` accepts as `v` (for the half types, whose values
/// widened to f32 print with digits the half type does not have: f16 0.1 is
/// 0.099975586 as an f32, but `0.1` reads back to the same f16).
fn shortest(v: f64, same: impl Fn(f64) -> bool) -> String {
    for digits in 0..17 {
        let text = format!("{v:.digits$e}");
        if let Ok(x) = text.parse::<f64>() {
            if same(x) {
                return format!("{x:?}");
            }
        }
    }
    format!("{v:?}")
}

/// The whole printout, ending in a newline.
pub fn render(a: &Array) -> String {
    let shape = a.shape();
    let storage = a.as_host().storage();
    let dims: Vec<String> = shape.iter().map(ToString::to_string).collect();
    let mut out = format!("{}[{}]\n", a.dtype(), dims.join(","));
    if shape.is_empty() {
        out.push_str(&element(storage, 0));
        out.push('\n');
        return out;
    }
    let summarise = a.len() > THRESHOLD;
    let strides: Vec<usize> = (0..shape.len())
        .map(|k| shape[k + 1..].iter().product())
        .collect();
    // First pass: the text of every shown element, for a common column width.
    let mut cells = Vec::new();
    collect(shape, &strides, summarise, 0, 0, &mut |i| {
        cells.push(element(storage, i))
    });
    let width = cells.iter().map(String::len).max().unwrap_or(0);
    let mut cells = cells.into_iter();
    let mut body = String::new();
    write_axis(shape, summarise, 0, width, &mut cells, &mut body);
    out.push_str(&body);
    out.push('\n');
    out
}

fn collect(
    shape: &[usize],
    strides: &[usize],
    summarise: bool,
    axis: usize,
    base: usize,
    f: &mut dyn FnMut(usize),
) {
    for i in shown(shape[axis], summarise).into_iter().flatten() {
        let off = base + i * strides[axis];
        if axis + 1 == shape.len() {
            f(off);
        } else {
            collect(shape, strides, summarise, axis + 1, off, f);
        }
    }
}

fn write_axis(
    shape: &[usize],
    summarise: bool,
    axis: usize,
    width: usize,
    cells: &mut dyn Iterator<Item = String>,
    out: &mut String,
) {
    out.push('[');
    let last = axis + 1 == shape.len();
    let items = shown(shape[axis], summarise);
    // Rows of a matrix go one a line, aligned under the opening bracket; deeper
    // blocks are separated by a blank line, as numpy does.
    let sep = if last {
        ", ".to_string()
    } else {
        format!(
            ",{}{}",
            "\n".repeat(shape.len() - axis - 1),
            " ".repeat(axis + 1)
        )
    };
    for (k, item) in items.iter().enumerate() {
        if k > 0 {
            out.push_str(&sep);
        }
        match item {
            None => out.push_str("..."),
            Some(_) if last => {
                let c = cells.next().unwrap_or_default();
                out.push_str(&format!("{c:>width$}"));
            }
            Some(_) => write_axis(shape, summarise, axis + 1, width, cells, out),
        }
    }
    out.push(']');
}
