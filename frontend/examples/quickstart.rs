//! The README's quickstart, runnable: `cargo run --example quickstart -p ndfuse`.
//!
//! Builds two expressions over the same input, evaluates them in one graph (fused into
//! kernels and JIT-compiled), and shows that mistakes come back as values.

use ndfuse::{Context, DType};

fn main() -> Result<(), ndfuse::Error> {
    let ctx = Context::new(); // default dtype f32, backend auto
    let a = ctx.rand_uniform(&[4, 8], -1.0, 1.0, 7); // seeded: same data every release
    let b = ctx.from_vec(vec![0.5f32; 8], &[8])?;
    let y = (&a * &b + 1.0).exp().sum(1); // nothing runs yet
    let z = a.softmax(-1);
    let out = ctx.eval(&[&y, &z])?; // one graph, two outputs
    println!("{:?} {:?}", out[0].shape(), out[0].to_vec::<f32>()?);
    println!(
        "{:?} row 0: {:?}",
        out[1].shape(),
        &out[1].as_slice::<f32>()?[..8]
    );

    // Mistakes are values, not panics: the error names the shapes and this line.
    let c = ctx.ones(&[3]);
    match (&a + &c).eval() {
        Ok(_) => println!("unexpected: [4,8] + [3] evaluated"),
        Err(e) => println!("error, as expected: {e}"),
    }

    ctx.set_default_dtype(DType::F16)?; // like ND4J's setDTypeForContext
    let h = ctx.ones(&[2]) * 1.5;
    println!("{} {:?}", h.dtype()?, h.eval()?.to_vec::<ndfuse::f16>()?);
    Ok(())
}
