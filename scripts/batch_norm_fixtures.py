#!/usr/bin/env python3
"""PyTorch's batch_norm on small cases, as .npy fixtures for tests/tests/batch_norm.rs.

    /tmp/peers-venv/bin/python scripts/batch_norm_fixtures.py   # any Python with torch + numpy

Writes tests/fixtures/batch_norm/<case>/{x,rm,rv,w,b,r,y,gx,gw,gb,rm_out,rv_out}.npy and
tests/fixtures/batch_norm/cases.txt (one line per case: name, training or eval, affine or
plain, momentum, eps). Inputs are f32 with a fixed seed; y = batch_norm(x, rm, rv, w, b)
and the gradients of sum(y * r) are computed by torch in f64 from those same values, and
rm_out / rv_out are the running statistics torch leaves (updated in place in training).
"""
import os

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures",
                    "batch_norm")

# name, x shape, training, affine, momentum, eps
CASES = [
    ("bn2_train", (4, 3, 5, 5), True, True, 0.1, 1e-5),
    ("bn2_eval", (2, 3, 4, 4), False, True, 0.1, 1e-5),
    ("bn1_train_plain", (8, 6), True, False, 0.3, 1e-3),
    ("bn1_eval_sequence", (2, 4, 7), False, True, 0.1, 1e-5),
]


def main():
    rng = np.random.default_rng(3737)
    os.makedirs(HERE, exist_ok=True)
    lines = []
    for name, xs, training, affine, momentum, eps in CASES:
        c = xs[1]
        x = (rng.uniform(-1, 1, xs) * 3 + 0.5).astype(np.float32)
        rm = rng.uniform(-0.5, 0.5, (c,)).astype(np.float32)
        rv = rng.uniform(0.5, 2.0, (c,)).astype(np.float32)
        w = rng.uniform(0.5, 1.5, (c,)).astype(np.float32)
        b = rng.uniform(-1, 1, (c,)).astype(np.float32)
        t = lambda a, grad=False: torch.tensor(a, dtype=torch.float64, requires_grad=grad)
        tx, tw, tb = t(x, True), t(w, True), t(b, True)
        trm, trv = t(rm), t(rv)
        y = F.batch_norm(tx, trm, trv, tw if affine else None, tb if affine else None,
                         training=training, momentum=momentum, eps=eps)
        rr = rng.uniform(-1, 1, xs).astype(np.float32)
        (y * t(rr)).sum().backward()
        d = os.path.join(HERE, name)
        os.makedirs(d, exist_ok=True)
        arrays = [("x", x), ("rm", rm), ("rv", rv), ("w", w), ("b", b), ("r", rr),
                  ("y", y.detach().numpy()), ("gx", tx.grad.numpy()),
                  ("rm_out", trm.numpy()), ("rv_out", trv.numpy())]
        if affine:
            arrays += [("gw", tw.grad.numpy()), ("gb", tb.grad.numpy())]
        for key, arr in arrays:
            np.save(os.path.join(d, key + ".npy"), arr)
        lines.append(" ".join([name, "train" if training else "eval",
                               "affine" if affine else "plain", repr(momentum), repr(eps)]))
    with open(os.path.join(HERE, "cases.txt"), "w") as f:
        f.write("# name form affine momentum eps (scripts/batch_norm_fixtures.py, torch "
                + torch.__version__ + ")\n")
        f.write("\n".join(lines) + "\n")
    print(f"{len(lines)} cases in {HERE}")


if __name__ == "__main__":
    main()
