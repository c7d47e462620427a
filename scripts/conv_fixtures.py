#!/usr/bin/env python3
"""PyTorch's conv1d / conv2d, conv_transpose1d / conv_transpose2d, max_pool2d and
avg_pool2d on small cases, as .npy fixtures for tests/tests/conv.rs and
tests/tests/conv_transpose.rs.

    /tmp/peers-venv/bin/python scripts/conv_fixtures.py   # any Python with torch + numpy

Writes tests/fixtures/conv/<case>/{x,w,b,r,y,gx,gw,gb}.npy and tests/fixtures/conv/cases.txt
(one line per case: name, spatial rank, stride, padding, dilation, groups, bias). Inputs
are f32 with a fixed seed; y = conv(x, w, b) and the gradients of sum(y * r) with respect
to x, w and b are computed by torch in f64 from those same f32 values, so a test compares
its f32 result with f64 truth under a stated tolerance.

Transposed convolutions go to tests/fixtures/conv_transpose/<case>/ with the same files
and tests/fixtures/conv_transpose/cases.txt (name, spatial rank, stride, padding,
output_padding, dilation, groups, bias); weights are [C, O / groups, k...].

Poolings go to tests/fixtures/pool/<case>/{x,r,y,gx}.npy and tests/fixtures/pool/cases.txt
(name, max/avg, kernel, stride, padding, dilation, count_include_pad). One max case has
ties (inputs on a coarse grid): torch sends the gradient to the first largest tap.
"""
import os

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "conv")

# name, rank, x shape, w shape, stride, padding ('same'/'valid'/int/tuple), dilation, groups, bias
CASES = [
    ("c2_basic", 2, (2, 3, 7, 6), (4, 3, 3, 3), 1, 0, 1, 1, True),
    ("c2_pad1", 2, (2, 3, 5, 5), (4, 3, 3, 3), 1, 1, 1, 1, True),
    ("c2_stride_pads", 2, (2, 3, 9, 8), (5, 3, 3, 2), (2, 1), (1, 2), 1, 1, True),
    ("c2_dilation", 2, (1, 2, 9, 9), (3, 2, 3, 3), 1, 2, 2, 1, True),
    ("c2_groups", 2, (2, 6, 5, 5), (4, 3, 3, 3), 1, 1, 1, 2, True),
    ("c2_depthwise", 2, (1, 4, 6, 6), (4, 1, 3, 3), 1, 1, 1, 4, True),
    ("c2_same_even", 2, (2, 2, 6, 5), (3, 2, 4, 3), 1, "same", 1, 1, True),
    ("c2_same_dilated", 2, (1, 3, 7, 7), (2, 3, 2, 2), 1, "same", 2, 1, False),
    ("c2_1x1_stride2", 2, (2, 3, 5, 6), (5, 3, 1, 1), 2, 0, 1, 1, True),
    ("c2_full_window", 2, (1, 2, 4, 5), (3, 2, 6, 5), 1, (1, 0), 1, 1, True),
    ("c2_odd_valid", 2, (3, 2, 9, 7), (3, 2, 2, 4), (3, 2), "valid", 1, 1, False),
    ("c1_basic", 1, (2, 3, 9), (4, 3, 3), 2, 1, 1, 1, True),
    ("c1_groups_same", 1, (1, 4, 11), (6, 2, 3), 1, "same", 2, 2, True),
]


TRANSPOSED = os.path.join(HERE, "..", "conv_transpose")

# name, rank, x shape, w shape [C, O / groups, k...], stride, padding, output_padding,
# dilation, groups, bias
TRANSPOSED_CASES = [
    ("t2_basic", 2, (2, 3, 4, 5), (3, 4, 3, 3), 1, 0, 0, 1, 1, True),
    ("t2_stride2_pad1_out1", 2, (2, 4, 5, 4), (4, 3, 3, 3), 2, 1, 1, 1, 1, True),
    ("t2_rect", 2, (1, 2, 5, 6), (2, 3, 2, 4), (3, 2), (1, 2), (2, 1), 1, 1, False),
    ("t2_groups_dilation", 2, (2, 4, 4, 5), (4, 2, 3, 3), (2, 1), 1, (1, 0), (2, 1), 2, True),
    ("t2_crop", 2, (1, 2, 6, 5), (2, 2, 2, 2), 2, 2, 0, 1, 1, True),
    ("t2_depthwise", 2, (1, 3, 5, 5), (3, 1, 3, 3), 2, 1, 1, 1, 3, True),
    ("t1_basic", 1, (2, 3, 7), (3, 2, 3), 2, 1, 1, 1, 1, True),
    ("t1_dilated_groups", 1, (1, 4, 6), (4, 3, 2), 1, 0, 0, 3, 2, False),
]


POOL = os.path.join(HERE, "..", "pool")

# name, kind, x shape, kernel, stride, padding, dilation, count_include_pad, coarse inputs
POOLS = [
    ("mp_2x2", "max", (2, 3, 8, 8), 2, 2, 0, 1, True, False),
    ("mp_3s2p1", "max", (2, 2, 9, 7), 3, 2, 1, 1, True, False),
    ("mp_rect_dilated", "max", (1, 3, 9, 10), (2, 3), (1, 2), (1, 1), 2, True, False),
    ("mp_ties", "max", (2, 2, 6, 6), 3, 1, 1, 1, True, True),
    ("ap_2x2", "avg", (2, 3, 8, 8), 2, 2, 0, 1, True, False),
    ("ap_pad_counted", "avg", (2, 2, 9, 7), 3, 2, 1, 1, True, False),
    ("ap_pad_not_counted", "avg", (1, 2, 6, 5), 3, 1, 1, 1, False, False),
    ("ap_rect", "avg", (2, 1, 7, 8), (2, 3), (2, 1), (1, 0), 1, False, False),
]


def pools(rng):
    os.makedirs(POOL, exist_ok=True)
    lines = []
    for name, kind, xs, k, stride, padding, dilation, cip, coarse in POOLS:
        x = rng.uniform(-1, 1, xs).astype(np.float32)
        if coarse:
            x = (np.round(x * 2) / 2).astype(np.float32)
        tx = torch.tensor(x, dtype=torch.float64, requires_grad=True)
        if kind == "max":
            y = F.max_pool2d(tx, k, stride, padding, dilation)
        else:
            y = F.avg_pool2d(tx, k, stride, padding, count_include_pad=cip)
        rr = rng.uniform(-1, 1, tuple(y.shape)).astype(np.float32)
        (y * torch.tensor(rr, dtype=torch.float64)).sum().backward()
        d = os.path.join(POOL, name)
        os.makedirs(d, exist_ok=True)
        for key, arr in [("x", x), ("r", rr), ("y", y.detach().numpy()), ("gx", tx.grad.numpy())]:
            np.save(os.path.join(d, key + ".npy"), arr)
        lines.append(" ".join([
            name, kind, ",".join(map(str, pair(k, 2))), ",".join(map(str, pair(stride, 2))),
            ",".join(map(str, pair(padding, 2))), ",".join(map(str, pair(dilation, 2))),
            "counted" if cip else "not_counted",
        ]))
    with open(os.path.join(POOL, "cases.txt"), "w") as f:
        f.write("# name kind kernel stride padding dilation count_include_pad "
                "(scripts/conv_fixtures.py, torch " + torch.__version__ + ")\n")
        f.write("\n".join(lines) + "\n")
    print(f"{len(lines)} pooling cases in {POOL}")


def save_case(d, arrays, bias, tb):
    """Writes `arrays` (key, array) and, with a bias, its gradient into folder `d`."""
    os.makedirs(d, exist_ok=True)
    for key, arr in arrays:
        np.save(os.path.join(d, key + ".npy"), arr)
    if bias:
        np.save(os.path.join(d, "gb.npy"), tb.grad.numpy())
    elif os.path.exists(os.path.join(d, "gb.npy")):
        os.remove(os.path.join(d, "gb.npy"))


def transposed(rng):
    lines = []
    for name, r, xs, ws, stride, padding, out_pad, dilation, groups, bias in TRANSPOSED_CASES:
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
        save_case(os.path.join(TRANSPOSED, name),
                  [("x", x), ("w", w), ("b", b), ("r", rr), ("y", y.detach().numpy()),
                   ("gx", tx.grad.numpy()), ("gw", tw.grad.numpy())], bias, tb)
        lines.append(" ".join([
            name, str(r), ",".join(map(str, pair(stride, r))),
            ",".join(map(str, pair(padding, r))), ",".join(map(str, pair(out_pad, r))),
            ",".join(map(str, pair(dilation, r))), str(groups), "bias" if bias else "nobias",
        ]))
    with open(os.path.join(TRANSPOSED, "cases.txt"), "w") as f:
        f.write("# name rank stride padding output_padding dilation groups bias "
                "(scripts/conv_fixtures.py, torch " + torch.__version__ + ")\n")
        f.write("\n".join(lines) + "\n")
    print(f"{len(lines)} transposed cases in {TRANSPOSED}")


def pair(v, r):
    return tuple(v) if isinstance(v, tuple) else (v,) * r


def main():
    rng = np.random.default_rng(36)
    os.makedirs(HERE, exist_ok=True)
    lines = []
    for name, r, xs, ws, stride, padding, dilation, groups, bias in CASES:
        x = rng.uniform(-1, 1, xs).astype(np.float32)
        w = rng.uniform(-1, 1, ws).astype(np.float32)
        b = rng.uniform(-1, 1, (ws[0],)).astype(np.float32)
        tx = torch.tensor(x, dtype=torch.float64, requires_grad=True)
        tw = torch.tensor(w, dtype=torch.float64, requires_grad=True)
        tb = torch.tensor(b, dtype=torch.float64, requires_grad=True) if bias else None
        conv = F.conv1d if r == 1 else F.conv2d
        y = conv(tx, tw, tb, stride=stride, padding=padding, dilation=dilation, groups=groups)
        rr = rng.uniform(-1, 1, tuple(y.shape)).astype(np.float32)
        (y * torch.tensor(rr, dtype=torch.float64)).sum().backward()
        save_case(os.path.join(HERE, name),
                  [("x", x), ("w", w), ("b", b), ("r", rr), ("y", y.detach().numpy()),
                   ("gx", tx.grad.numpy()), ("gw", tw.grad.numpy())], bias, tb)
        pad = padding if isinstance(padding, str) else ",".join(map(str, pair(padding, r)))
        lines.append(" ".join([
            name, str(r), ",".join(map(str, pair(stride, r))), pad,
            ",".join(map(str, pair(dilation, r))), str(groups), "bias" if bias else "nobias",
        ]))
    with open(os.path.join(HERE, "cases.txt"), "w") as f:
        f.write("# name rank stride padding dilation groups bias (scripts/conv_fixtures.py, torch "
                + torch.__version__ + ")\n")
        f.write("\n".join(lines) + "\n")
    print(f"{len(lines)} cases in {HERE}")
    pools(np.random.default_rng(37))
    transposed(np.random.default_rng(3636))


if __name__ == "__main__":
    main()
