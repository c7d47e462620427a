#!/usr/bin/env python3
"""onnxruntime's latency on the inputs of onnx/examples/bench_onnx.rs (the peer of
that example; run the two back to back on a quiet machine):

    /tmp/onnx-venv/bin/python scripts/onnx_peer.py /tmp/ndfuse-onnx [RUNS]

onnxruntime runs with as many intra-op threads as the machine has cores (its default)
and every graph optimisation on (ORT_ENABLE_ALL, its default).
"""
import os, sys, time

import numpy as np
import onnxruntime as ort


def signal(shape, scale):
    n = int(np.prod(shape))
    i = np.arange(n, dtype=np.float64)
    return (scale * (0.5 * np.sin(0.37 * i) + 0.5 * np.cos(0.011 * i))).astype(np.float32).reshape(shape)


def main(root, runs):
    cases = [
        ("silero-vad, 10 s of audio", "silero-vad/silero_vad_16k_sequence.onnx",
         {"input": signal([313, 576], 0.2), "h": signal([1, 1, 128], 0.0), "c": signal([1, 1, 128], 0.0)}),
        ("PP-OCRv4 detector, 640x640", "rapidocr/ch_PP-OCRv4_det_infer.onnx",
         {"x": signal([1, 3, 640, 640], 1.0)}),
    ]
    for what, rel, feed in cases:
        sess = ort.InferenceSession(os.path.join(root, rel), providers=["CPUExecutionProvider"])
        t0 = time.perf_counter()
        sess.run(None, feed)
        first = time.perf_counter() - t0
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            sess.run(None, feed)
            times.append(time.perf_counter() - t)
        times.sort()
        print("%s: onnxruntime %s median %.2f ms (min %.2f, max %.2f), first run %.0f ms"
              % (what, ort.__version__, times[runs // 2] * 1e3, times[0] * 1e3, times[-1] * 1e3, first * 1e3))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 10)
