#!/usr/bin/env python3
"""Reference outputs of the real ONNX models that ndfuse-onnx's tests run, from
onnxruntime (the reference implementation), stored as small JSON fixtures in
onnx/tests/fixtures/.

    python3 -m venv /tmp/onnx-venv && /tmp/onnx-venv/bin/pip install onnx==1.19.1 onnxruntime numpy
    bash scripts/fetch_onnx.sh /tmp/ndfuse-onnx
    /tmp/onnx-venv/bin/python scripts/onnx_fixtures.py /tmp/ndfuse-onnx

Inputs are not stored: every float input is the same formula of its flat index i,
0.5 * sin(0.37 * i) + 0.5 * cos(0.011 * i) (scaled per input below), or a page of
text-like blocks (text_image), which the Rust test computes too. Small outputs are stored whole; large ones as every STRIDE-th
element plus their sum.
"""
import json, math, os, sys

import numpy as np
import onnxruntime as ort

SAMPLE = 4096  # outputs with more elements are sampled


def signal(shape, scale):
    n = int(np.prod(shape))
    i = np.arange(n, dtype=np.float64)
    x = scale * (0.5 * np.sin(0.37 * i) + 0.5 * np.cos(0.011 * i))
    return x.astype(np.float32).reshape(shape)


def text_image(shape):
    """Dark glyph-sized blocks in rows on a light page, normalised as PP-OCR's
    preprocessing leaves an image (about -2 for ink, 2 for paper), plus a ripple of
    the signal above so no two pixels are alike."""
    n, c, h, w = shape
    y = np.arange(h).reshape(h, 1)
    x = np.arange(w).reshape(1, w)
    ink = ((y % 32 >= 10) & (y % 32 < 22) & (x % 24 >= 4) & (x % 24 < 20) & (x >= 16) & (x < w - 16))
    page = np.where(ink, -2.0, 2.0)
    img = np.broadcast_to(page, shape).astype(np.float64) + 0.1 * signal(shape, 1.0).astype(np.float64)
    return img.astype(np.float32)


CASES = {
    "silero_vad": (
        "silero-vad/silero_vad_16k_sequence.onnx",
        # 24 chunks of 576 samples (64 of context + 512 new), the LSTM state zero.
        {"input": ([24, 576], 0.2), "h": ([1, 1, 128], 0.0), "c": ([1, 1, 128], 0.0)},
    ),
    "ppocr_cls": (
        "rapidocr/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        {"x": ([2, 3, 48, 192], 1.0)},
    ),
    "ppocr_det": (
        "rapidocr/ch_PP-OCRv4_det_infer.onnx",
        {"x": ([1, 3, 128, 160], "text")},
    ),
}


def main(root):
    out = {}
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    for name, (rel, inputs) in CASES.items():
        sess = ort.InferenceSession(os.path.join(root, rel), opts, providers=["CPUExecutionProvider"])
        feed = {k: text_image(s) if scale == "text" else signal(s, scale) for k, (s, scale) in inputs.items()}
        names = [o.name for o in sess.get_outputs()]
        res = sess.run(names, feed)
        outs = {}
        for n, r in zip(names, res):
            r = np.asarray(r, dtype=np.float64)
            flat = r.reshape(-1)
            stride = max(1, math.ceil(flat.size / SAMPLE))
            outs[n] = {
                "shape": list(r.shape),
                "stride": stride,
                "values": [float(v) for v in flat[::stride]],
                "sum": float(flat.sum()),
            }
        out[name] = {
            "model": rel,
            "inputs": {k: {"shape": s, "scale": scale} for k, (s, scale) in inputs.items()},
            "outputs": outs,
            "onnxruntime": ort.__version__,
        }
        print(name, {n: o["shape"] for n, o in outs.items()})
    path = os.path.join(os.path.dirname(__file__), "..", "onnx", "tests", "fixtures", "models.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print("wrote", os.path.normpath(path))


if __name__ == "__main__":
    main(sys.argv[1])
