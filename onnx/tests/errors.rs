//! Models built in the test (no files needed): what imports and runs, and every kind of
//! bad input as a clear `Err` naming what the user can act on, never a panic.

use ndfuse::{Array, Context};
use ndfuse_onnx::proto::attribute_proto::AttributeType;
use ndfuse_onnx::proto::tensor_proto::DataType;
use ndfuse_onnx::proto::tensor_shape_proto::{dimension, Dimension};
use ndfuse_onnx::proto::{
    type_proto, AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto,
    TensorShapeProto, TypeProto, ValueInfoProto,
};
use ndfuse_onnx::{Model, OnnxError};
use prost::Message;

fn node(
    op: &str,
    name: &str,
    inputs: &[&str],
    outputs: &[&str],
    attrs: Vec<AttributeProto>,
) -> NodeProto {
    NodeProto {
        op_type: Some(op.into()),
        name: Some(name.into()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        attribute: attrs,
        ..Default::default()
    }
}

fn int_attr(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Int as i32),
        i: Some(v),
        ..Default::default()
    }
}

fn str_attr(name: &str, v: &str) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::String as i32),
        s: Some(v.as_bytes().to_vec()),
        ..Default::default()
    }
}

fn value(name: &str, elem: DataType, dims: &[i64]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|&d| Dimension {
            value: Some(if d < 0 {
                dimension::Value::DimParam("n".into())
            } else {
                dimension::Value::DimValue(d)
            }),
            ..Default::default()
        })
        .collect();
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(elem as i32),
                shape: Some(TensorShapeProto { dim }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn f32_init(name: &str, dims: &[i64], v: &[f32]) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(DataType::Float as i32),
        float_data: v.to_vec(),
        ..Default::default()
    }
}

fn model(
    nodes: Vec<NodeProto>,
    inputs: Vec<ValueInfoProto>,
    outputs: Vec<ValueInfoProto>,
    init: Vec<TensorProto>,
) -> Vec<u8> {
    ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(17),
        }],
        graph: Some(GraphProto {
            node: nodes,
            input: inputs,
            output: outputs,
            initializer: init,
            name: Some("g".into()),
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

fn f32s(v: &[f32], shape: &[usize]) -> Array {
    Array::from_vec(v.to_vec(), shape).unwrap()
}

/// `relu(x @ w + b)` with `w`, `b` initializers: the values by hand.
fn gemm_relu() -> Vec<u8> {
    model(
        vec![
            node(
                "Gemm",
                "fc",
                &["x", "w", "b"],
                &["y"],
                vec![int_attr("transB", 1)],
            ),
            node("Relu", "act", &["y"], &["z"], vec![]),
        ],
        vec![value("x", DataType::Float, &[-1, 3])],
        vec![value("z", DataType::Float, &[-1, 2])],
        vec![
            f32_init("w", &[2, 3], &[1.0, 2.0, 3.0, -1.0, -2.0, -3.0]),
            f32_init("b", &[2], &[0.5, 0.25]),
        ],
    )
}

#[test]
fn a_small_model_runs_on_every_backend() {
    let m = Model::from_bytes(&gemm_relu(), "gemm_relu").unwrap();
    for backend in [ndfuse::BackendKind::Cpu, ndfuse::BackendKind::Interp] {
        let ctx = Context::new();
        ctx.set_backend(backend);
        let x = f32s(&[1.0, 1.0, 1.0, -1.0, 0.0, 2.0], &[2, 3]);
        let out = m.run(&ctx, &[("x".into(), x)]).unwrap();
        assert_eq!(out[0].0, "z");
        // Row 0: [6.5, -5.75] -> [6.5, 0]; row 1: [5.5, -4.75] -> [5.5, 0].
        assert_eq!(
            out[0].1.to_vec::<f32>().unwrap(),
            vec![6.5, 0.0, 5.5, 0.0],
            "{backend:?}"
        );
    }
}

#[test]
fn a_shape_computed_from_shape_is_folded_at_import() {
    // reshape(x, concat(shape(x)[0:1], [-1])): the target shape is known at import.
    let starts = TensorProto {
        name: Some("s".into()),
        dims: vec![1],
        data_type: Some(DataType::Int64 as i32),
        int64_data: vec![0],
        ..Default::default()
    };
    let ends = TensorProto {
        name: Some("e".into()),
        int64_data: vec![1],
        ..starts.clone()
    };
    let minus = TensorProto {
        name: Some("m".into()),
        int64_data: vec![-1],
        ..starts.clone()
    };
    let bytes = model(
        vec![
            node("Shape", "shape", &["x"], &["sh"], vec![]),
            node("Slice", "first", &["sh", "s", "e"], &["n"], vec![]),
            node(
                "Concat",
                "target",
                &["n", "m"],
                &["t"],
                vec![int_attr("axis", 0)],
            ),
            node("Reshape", "flat", &["x", "t"], &["y"], vec![]),
        ],
        vec![value("x", DataType::Float, &[-1, 3, 4])],
        vec![value("y", DataType::Float, &[-1, 12])],
        vec![starts, ends, minus],
    );
    let m = Model::from_bytes(&bytes, "reshape").unwrap();
    let ctx = Context::new();
    let x = f32s(&(0..24).map(|v| v as f32).collect::<Vec<_>>(), &[2, 3, 4]);
    let out = m.build(&ctx, &[("x".into(), x)]).unwrap();
    assert_eq!(out[0].1.shape().unwrap(), &[2, 12]);
    // The graph holds the reshape of the input and nothing of the shape arithmetic.
    let text = ctx.graph_text(&[&out[0].1]).unwrap();
    assert!(!text.contains("concat") && !text.contains("i64"), "{text}");
    // The model keeps its constants between builds, never a value from a shape.
    let x = f32s(&[0.5; 5 * 3 * 4], &[5, 3, 4]);
    let out = m.run(&ctx, &[("x".into(), x)]).unwrap();
    assert_eq!(out[0].1.shape(), &[5, 12]);
}

#[test]
fn bytes_that_are_not_a_model_are_errors() {
    let good = gemm_relu();
    let e = Model::from_bytes(&good[..good.len() / 2], "half.onnx").unwrap_err();
    assert!(matches!(e, OnnxError::Decode { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("half.onnx is not a valid ONNX model"),
        "{e}"
    );
    let e = Model::from_bytes(b"\x89PNG\r\n\x1a\n not a model at all", "picture.png").unwrap_err();
    assert!(
        e.to_string()
            .contains("picture.png is not a valid ONNX model"),
        "{e}"
    );
    let e = Model::from_bytes(&[], "empty.onnx").unwrap_err();
    assert!(e.to_string().contains("has no graph"), "{e}");
    let e = Model::load("/nonexistent/model.onnx").unwrap_err();
    assert!(
        e.to_string()
            .contains("cannot read /nonexistent/model.onnx"),
        "{e}"
    );
}

#[test]
fn an_unsupported_operator_or_attribute_names_node_operator_and_opset() {
    let bytes = model(
        vec![node("FancyOp", "layer7", &["x"], &["y"], vec![])],
        vec![value("x", DataType::Float, &[2])],
        vec![value("y", DataType::Float, &[2])],
        vec![],
    );
    let m = Model::from_bytes(&bytes, "m").unwrap();
    let e = m
        .run(&Context::new(), &[("x".into(), f32s(&[1.0, 2.0], &[2]))])
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "node 'layer7' (FancyOp, opset 17): the operator is not supported"
    );
    let bytes = model(
        vec![node(
            "ScatterElements",
            "scatter",
            &["x", "i", "u"],
            &["y"],
            vec![str_attr("reduction", "max")],
        )],
        vec![value("x", DataType::Float, &[2])],
        vec![value("y", DataType::Float, &[2])],
        vec![
            TensorProto {
                name: Some("i".into()),
                dims: vec![1],
                data_type: Some(DataType::Int64 as i32),
                int64_data: vec![1],
                ..Default::default()
            },
            f32_init("u", &[1], &[5.0]),
        ],
    );
    let m = Model::from_bytes(&bytes, "m").unwrap();
    let e = m
        .run(&Context::new(), &[("x".into(), f32s(&[1.0, 2.0], &[2]))])
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "node 'scatter' (ScatterElements, opset 17): reduction='max' is not supported"
    );
}

#[test]
fn wrong_missing_or_unknown_inputs_are_named() {
    let m = Model::from_bytes(&gemm_relu(), "m").unwrap();
    let ctx = Context::new();
    let ints = Array::from_vec(vec![1i64, 2, 3], &[1, 3]).unwrap();
    let e = m.run(&ctx, &[("x".into(), ints)]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "input 'x': the model declares f32, the array given is i64"
    );
    let e = m
        .run(&ctx, &[("x".into(), f32s(&[1.0; 4], &[1, 4]))])
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "input 'x': the model declares shape [?, 3], the array given has [1, 4]"
    );
    let e = m.run(&ctx, &[]).unwrap_err();
    assert!(e.to_string().starts_with("input 'x': not given"), "{e}");
    let e = m
        .run(
            &ctx,
            &[
                ("x".into(), f32s(&[1.0; 3], &[1, 3])),
                ("y".into(), f32s(&[1.0], &[1])),
            ],
        )
        .unwrap_err();
    assert_eq!(e.to_string(), "input 'y': the model has no such input");
}

#[test]
fn a_shape_computed_from_the_data_is_an_error_naming_the_node() {
    // reshape(x, cast(x * 0 + 2, i64)) with x of 100 elements: the shape depends on data.
    let bytes = model(
        vec![
            node(
                "Cast",
                "to_int",
                &["x"],
                &["xi"],
                vec![int_attr("to", DataType::Int64 as i64)],
            ),
            node("Reshape", "dynamic", &["x", "xi"], &["y"], vec![]),
        ],
        vec![value("x", DataType::Float, &[100])],
        vec![value("y", DataType::Float, &[-1])],
        vec![],
    );
    let m = Model::from_bytes(&bytes, "m").unwrap();
    let e = m
        .run(&Context::new(), &[("x".into(), f32s(&[1.0; 100], &[100]))])
        .unwrap_err();
    let text = e.to_string();
    assert!(
        text.starts_with(
            "node 'dynamic' (Reshape, opset 17): input 1 ('xi') computed from the graph's inputs"
        ),
        "{text}"
    );
}

#[test]
fn a_bad_initializer_is_an_error_naming_the_tensor() {
    let bytes = model(
        vec![node("Relu", "r", &["w"], &["y"], vec![])],
        vec![],
        vec![value("y", DataType::Float, &[4])],
        vec![f32_init("w", &[4], &[1.0, 2.0])],
    );
    let m = Model::from_bytes(&bytes, "m").unwrap();
    let e = m.run(&Context::new(), &[]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "tensor 'w': float_data holds 2 values, the shape needs 4"
    );
    let mut t = f32_init("u8", &[1], &[]);
    t.data_type = Some(DataType::Uint8 as i32);
    t.raw_data = Some(vec![7]);
    let bytes = model(
        vec![node("Relu", "r", &["u8"], &["y"], vec![])],
        vec![],
        vec![value("y", DataType::Float, &[1])],
        vec![t],
    );
    let e = Model::from_bytes(&bytes, "m")
        .unwrap()
        .run(&Context::new(), &[])
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "tensor 'u8': element type UINT8 is not supported"
    );
}

#[test]
fn damaged_models_are_errors_not_panics() {
    let good = gemm_relu();
    let ctx = Context::new();
    ctx.set_backend(ndfuse::BackendKind::Interp);
    let x = f32s(&[1.0, 1.0, 1.0], &[1, 3]);
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..3000 {
        let mut bytes = good.clone();
        for _ in 0..1 + next() % 3 {
            let i = (next() as usize) % bytes.len();
            bytes[i] = next() as u8;
        }
        // Whatever the bytes say, the answer is a model or an error.
        if let Ok(m) = Model::from_bytes(&bytes, "damaged") {
            let _ = m.run(&ctx, &[("x".into(), x.clone())]);
        }
    }
}
