//! Prints the operator support table of onnx/README.md (between its markers):
//! `cargo run -p ndfuse-onnx --example support_table`.

fn main() {
    print!("{}", ndfuse_onnx::support_table());
}
