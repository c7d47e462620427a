#!/usr/bin/env python3
"""PyTorch's conv_transpose1d / conv_transpose2d on small cases, as .npy fixtures for
tests/tests/conv_transpose.rs.

    /tmp/peers-venv/bin/python scripts/conv_transpose_fixtures.py   # any Python with torch + numpy

Writes tests/fixtures/conv_transpose/<case>/{x,w,b,r,y,gx,gw,gb}.npy and
tests/fixtures/conv_transpose/cases.txt (one line per case: name, spatial rank, stride,
padding, output_padding, dilation, groups, bias). Inputs are f32 with a fixed seed; y =
conv_transpose(x, w, b) and the gradients of sum(y * r) with respect to x, w and b are
computed by torch in f64 from those same f32 values.
"""
import os

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures",
                    "conv_transpose")

# name, rank, x shape, w shape [C, O / groups, k...], stride, padding, output_padding,
# dilation, groups, bias
CASES = [
    ("t2_basic", 2, (2, 3, 4, 5), (3, 4, 3, 3), 1, 0, 0, 1, 1, True),
    ("t2_stride2_pad1_out1", 2, (2, 4, 5, 4), (4, 3, 3, 3), 2, 1, 1, 1, 1, True),
    ("t2_rect", 2, (1, 2, 5, 6), (2, 3, 2, 4), (3, 2), (1, 2), (2, 1), 1, 1, False),
    ("t2_groups_dilation", 2, (2, 4, 4, 5), (4, 2, 3, 3), (2, 1), 1, (1, 0), (2, 1), 2, True),
    ("t2_crop", 2, (1, 2, 6, 5), (2, 2, 2, 2), 2, 2, 0, 1, 1, True),
    ("t2_depthwise", 2, (1, 3, 5, 5), (3, 1, 3, 3), 2, 1, 1, 1, 3, True),
    ("t1_basic", 1, (2, 3, 7), (3, 2, 3), 2, 1, 1, 1, 1, True),
    ("t1_dilated_groups", 1, (1, 4, 6), (4, 3, 2), 1, 0, 0, 3, 2, False),
]


def pair(v, r):
    return tuple(v) if isinstance(v, tuple) else (v,) * r


def main():
    rng = np.random.default_rng(3636)
    os.makedirs(HERE, exist_ok=True)
    lines = []
    for name, r, xs, ws, stride, padding, out_pad, dilation, groups, bias in CASES:
        x = rng.uniform(-1, 1, xs).astype(np.float32)
        w = rng.uniform(-1, 1, ws).astype(np.float32)
        b = rng.uniform(-1, 1, (ws[1] * groups,)).astype(np.float32)
        tx = torch.tensor(x, dtype=torch.float64, requires_grad=True)
        tw = torch.tensor(w, dtype=torch.float64, requires_grad=True)
        tb = torch.tensor(b, dtype=torch.float64, requires_grad=True) if bias else None
        conv = F.conv_transpose1d if r == 1 else F.conv_transpose2d
        y = conv(tx, tw, tb, stride=stride, padding=padding, output_padding=out_pad,
                 groups=groups, dilation=dilation)
        rr = rng.uniform(-1, 1, tuple(y.shape)).astype(np.float32)
        (y * torch.tensor(rr, dtype=torch.float64)).sum().backward()
        d = os.path.join(HERE, name)
        os.makedirs(d, exist_ok=True)
        for key, arr in [("x", x), ("w", w), ("b", b), ("r", rr),
                         ("y", y.detach().numpy()), ("gx", tx.grad.numpy()),
                         ("gw", tw.grad.numpy())]:
            np.save(os.path.join(d, key + ".npy"), arr)
        if bias:
            np.save(os.path.join(d, "gb.npy"), tb.grad.numpy())
        lines.append(" ".join([
            name, str(r), ",".join(map(str, pair(stride, r))),
            ",".join(map(str, pair(padding, r))), ",".join(map(str, pair(out_pad, r))),
            ",".join(map(str, pair(dilation, r))), str(groups), "bias" if bias else "nobias",
        ]))
    with open(os.path.join(HERE, "cases.txt"), "w") as f:
        f.write("# name rank stride padding output_padding dilation groups bias "
                "(scripts/conv_transpose_fixtures.py, torch " + torch.__version__ + ")\n")
        f.write("\n".join(lines) + "\n")
    print(f"{len(lines)} cases in {HERE}")


if __name__ == "__main__":
    main()
