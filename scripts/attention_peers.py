#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention (eager and torch.compile) on the CPU, on the
attention rows of `ndfuse bench` with the same shapes, so that a comparison is one
command beside the bench:

    /tmp/peers-venv/bin/python scripts/attention_peers.py [--threads N] [--runs N]

Rows: `attention_causal`, causal f32 q, k, v [8, 8, 512, 64], scale 0.125, forward; and
`attention_causal_grad`, the gradients of sum(attention(q, k, v) * r) with respect to q,
k and v (forward and backward). Each timing: warm-up calls (the first compiles), then the
median of the runs. Run it when nothing else is busy (the report prints the load
average). Needs torch (scripts/cpu_peers.py says how to install it).
"""
import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F


def timed(call, warmup=3, runs=10):
    for _ in range(warmup):
        call()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads, load {os.getloadavg()[0]:.2f}")
    b, h, t, d = 8, 8, 512, 64
    gen = torch.Generator().manual_seed(1)
    q, k, v, r = [torch.rand(b, h, t, d, generator=gen) * 2 - 1 for _ in range(4)]

    def forward(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.125)

    compiled = torch.compile(forward, dynamic=False)
    flops = 2 * b * h * t * t * d  # two products, half of each under the mask
    print("| row | peer | median ms | GFLOP/s |")
    print("| --- | --- | --- | --- |")
    for name, f in [("torch eager", forward), ("torch.compile", compiled)]:
        with torch.no_grad():
            ms = timed(lambda: f(q, k, v), runs=args.runs)
        print(f"| attention_causal | {name} | {ms:.2f} | {flops / ms / 1e6:.1f} |")
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    for name, f in [("torch eager", forward), ("torch.compile", compiled)]:
        def step():
            for x in leaves:
                x.grad = None
            (f(*leaves) * r).sum().backward()

        ms = timed(step, runs=args.runs)
        print(f"| attention_causal_grad | {name} | {ms:.2f} | {flops * 3.5 / ms / 1e6:.1f} |")
    print(f"load at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
