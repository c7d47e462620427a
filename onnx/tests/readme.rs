//! onnx/README.md's support table is the importer's own (`ndfuse_onnx::support_table`):
//! regenerate it with `cargo run -p ndfuse-onnx --example support_table`.

#[test]
fn readme_lists_exactly_the_supported_operators() {
    let readme = include_str!("../README.md");
    let (start, end) = (
        "<!-- support table: start -->\n",
        "<!-- support table: end -->",
    );
    let a = readme.find(start).expect("README has the start marker") + start.len();
    let b = readme.find(end).expect("README has the end marker");
    assert_eq!(
        &readme[a..b],
        ndfuse_onnx::support_table(),
        "onnx/README.md's table is stale: cargo run -p ndfuse-onnx --example support_table"
    );
}
