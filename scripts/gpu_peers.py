#!/usr/bin/env python3
"""PyTorch eager and torch.compile on the rows of `ndfuse bench --backend cuda`.

Run it on the GPU machine beside the bench, so each of our rows has a peer measured on
the same card in the same command:

    python3 scripts/gpu_peers.py [--quick] [--out FILE]

It measures the device-to-device copy bandwidth (2^26 f32, best of 10, read + written
bytes), the matrix-unit peaks torch.matmul reaches (bf16, f16, true f32, tf32), then
each row in eager and compiled form (`torch.compile(fn, dynamic=False)`), and prints a
markdown table. The shapes are the GPU's of bench/src/cases.rs (`cases_on(Size::Full,
true)`: 2^26 elements, rows of 4096, [8192, 8192], 4096^3 products). Memory rows report GB/s of ideal bytes (inputs read once, output
written once) and their fraction of the copy bandwidth; the products report TFLOP/s
(2*M*N*K) and their fraction of the peak for their dtype. f32 products run without TF32.
`--quick` shrinks every size 16x and times fewer runs. Without CUDA it runs on the CPU
at the quick sizes (wall-clock timing), for a smoke test.
"""
import argparse
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
try:
    from triton.testing import do_bench  # flushes the L2 before every timed call
except ImportError:
    do_bench = None


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def sync():
    if CUDA:
        torch.cuda.synchronize()


def set_tf32(allowed):
    # "highest" is true f32 in cuBLAS and in inductor's products; "high" allows TF32.
    torch.set_float32_matmul_precision("high" if allowed else "highest")


def bench_ms(fn, quick):
    """Median time of one call, ms: CUDA events on the GPU, wall clock on the CPU."""
    if CUDA:
        if do_bench is not None:
            return do_bench(fn, warmup=5 if quick else 25, rep=20 if quick else 100,
                            return_mode="median")
        for _ in range(3):
            fn()
        times = []
        for _ in range(20):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        return statistics.median(times)
    for _ in range(1 if quick else 3):
        fn()
    times = []
    for _ in range(3 if quick else 20):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def count_kernels(fn):
    """Device activities (kernels, memsets, copies) of one call, from the profiler."""
    if not CUDA:
        return None
    try:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            sync()
        return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    except Exception:  # noqa: BLE001 -- the count is optional
        return None


def copy_bandwidth(n):
    """GB/s of dst.copy_(src) over n f32: best of 10 after a warm-up, 2 * bytes / time."""
    src = torch.randn(n, device=DEV)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync()
    best = math.inf
    for _ in range(10):
        if CUDA:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            dst.copy_(src)
            b.record()
            b.synchronize()
            ms = a.elapsed_time(b)
        else:
            t = time.perf_counter()
            dst.copy_(src)
            ms = (time.perf_counter() - t) * 1e3
        best = min(best, ms)
    return 2 * n * 4 / (best * 1e-3) / 1e9


def matmul_peak(n, dtype, tf32, quick):
    """TFLOP/s of torch.matmul on n x n x n in dtype."""
    g = torch.Generator(device=DEV).manual_seed(1)
    x = torch.randn(n, n, device=DEV, generator=g).to(dtype)
    w = torch.randn(n, n, device=DEV, generator=g).to(dtype)
    set_tf32(tf32)
    try:
        ms = bench_ms(lambda: torch.matmul(x, w), quick)
    finally:
        set_tf32(False)
    return 2 * n**3 / (ms * 1e-3) / 1e12


# Row specs: name, expression, inputs as (name, shape, dtype), the function, and the
# ideal FLOPs (products) or None (memory rows: ideal bytes come from the tensors).
f32, f16, bf16 = torch.float32, torch.float16, torch.bfloat16


def gelu(x):
    return F.gelu(x, approximate="tanh")


def chain(a, b, c):
    return torch.exp(a * b + c) * torch.sqrt(torch.abs(a)) - b / (1 + c * c)


def softmax(x):
    return torch.softmax(x, dim=-1)


def layernorm(x):
    return F.layer_norm(x, (x.shape[-1],), eps=1e-5)


def total(x):
    return x.sum()


def colsum(x):
    return x.sum(0)


def rowsum(x):
    return x.sum(1)


def broadcast(a, b, c):
    return a * b + c


def matmul(x, w):
    return x @ w


def matmul_gelu(x, w, b):
    return F.gelu(x @ w + b, approximate="tanh")


def attention(q, k, v):
    return torch.softmax(q @ k.transpose(-1, -2) / 8, dim=-1) @ v


def rows(quick):
    """The rows; quick divides every element count by 16 (matrix sides by 4)."""
    v = lambda n: n // 16 if quick else n  # noqa: E731 -- vector length
    s = lambda n: n // 4 if quick else n  # noqa: E731 -- matrix side
    # The GPU shapes of bench/src/cases.rs (cases_on(Size::Full, gpu = true)).
    vec, sq, big = v(1 << 26), s(8192), s(4096)
    gm, gn, gk = s(4096), s(4096), s(4096)
    heads, seq, dim = (2 if quick else 32), 256, 64
    mm = lambda d: [("x", (big, big), d), ("w", (big, big), d)]  # noqa: E731
    mg = lambda d: [("x", (gm, gk), d), ("w", (gk, gn), d), ("b", (gn,), d)]  # noqa: E731
    return [
        ("gelu", 'gelu(x, approximate="tanh")', [("x", (vec,), f32)], gelu, None),
        ("chain", "exp(a*b+c) * sqrt(abs(a)) - b/(1+c*c)",
         [(n, (vec,), f32) for n in "abc"], chain, None),
        ("softmax", "softmax(x, dim=-1)", [("x", (s(16384), s(4096)), f32)], softmax, None),
        ("layernorm", "layer_norm(x, (N,), eps=1e-5)", [("x", (s(16384), s(4096)), f32)],
         layernorm, None),
        ("sum", "x.sum()", [("x", (v(1 << 26),), f32)], total, None),
        ("colsum", "x.sum(0)", [("x", (sq, sq), f32)], colsum, None),
        ("rowsum", "x.sum(1)", [("x", (s(16384), s(4096)), f32)], rowsum, None),
        ("broadcast", "a * b + c",
         [("a", (sq, sq), f32), ("b", (sq,), f32), ("c", (sq, 1), f32)], broadcast, None),
        ("gelu_f16", 'gelu(x, approximate="tanh")', [("x", (vec,), f16)], gelu, None),
        ("matmul_f32", "x @ w", mm(f32), matmul, 2 * big**3),
        ("matmul_gelu", 'gelu(x @ w + b, approximate="tanh")', mg(f32), matmul_gelu,
         2 * gm * gn * gk),
        ("attention", "softmax(q @ k.mT / 8, dim=-1) @ v",
         [(n, (heads, seq, dim), f32) for n in "qkv"], attention, 4 * heads * seq * seq * dim),
        ("matmul_f16", "x @ w", mm(f16), matmul, 2 * big**3),
        ("matmul_bf16", "x @ w", mm(bf16), matmul, 2 * big**3),
        ("matmul_gelu_bf16", 'gelu(x @ w + b, approximate="tanh")', mg(bf16), matmul_gelu,
         2 * gm * gn * gk),
    ]


DT = {f32: "f32", f16: "f16", bf16: "bf16"}


def run_mode(fn, inputs, flops, ref, quick):
    """(ms, rate text, fraction text) of fn on inputs."""
    call = lambda: fn(*inputs)  # noqa: E731
    out = call()
    sync()
    ms = bench_ms(call, quick)
    if flops is None:
        nbytes = sum(t.numel() * t.element_size() for t in inputs)
        nbytes += out.numel() * out.element_size()
        gbps = nbytes / (ms * 1e-3) / 1e9
        return ms, f"{gbps:.0f} GB/s", f"{100 * gbps / ref[0]:.0f}% copy"
    tflops = flops / (ms * 1e-3) / 1e12
    frac = f"{100 * tflops / ref[1]:.0f}% {ref[2]} peak" if ref[1] else ""
    return ms, f"{tflops:.1f} TFLOP/s", frac


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="sizes 16x smaller, fewer runs")
    ap.add_argument("--out", help="also write the markdown report to this file")
    args = ap.parse_args()
    quick = args.quick or not CUDA
    set_tf32(False)
    start = time.perf_counter()

    head = []
    if CUDA:
        p = torch.cuda.get_device_properties(0)
        head.append(f"device: {p.name}, {p.multi_processor_count} SMs, "
                    f"{p.total_memory / 2**30:.0f} GiB; torch {torch.__version__}, "
                    f"CUDA {torch.version.cuda}")
        head.append("timing: median of triton.testing.do_bench (L2 flushed before each run)"
                    if do_bench else "timing: median of 20 runs by CUDA events (no triton)")
    else:
        head.append(f"device: CPU (no CUDA available: quick sizes, wall-clock timing); "
                    f"torch {torch.__version__}")
    if quick:
        head.append("sizes: --quick (16x smaller), not comparable with the bench's rows")

    log("copy bandwidth ...")
    copy = copy_bandwidth((1 << 26) // (16 if quick else 1))
    head.append(f"copy bandwidth: {copy:.0f} GB/s (dst.copy_(src), read + written)")
    peaks = {}
    side = 2048 if quick else 8192
    for label, dtype, tf32, n in [("bf16", bf16, False, side), ("f16", f16, False, side),
                                  ("f32", f32, False, side // 2), ("tf32", f32, True, side // 2)]:
        log(f"matmul peak {label} {n}^3 ...")
        try:
            peaks[label] = matmul_peak(n, dtype, tf32, quick)
            head.append(f"matmul peak {label} {n}^3: {peaks[label]:.1f} TFLOP/s")
        except Exception as e:  # noqa: BLE001
            head.append(f"matmul peak {label}: error {type(e).__name__}: {e}")

    cols = ["row", "expression", "inputs", "eager ms", "eager rate", "eager of", "eager k",
            "compile ms", "compile rate", "compile of", "compile k", "compile s"]
    header, rule, table = "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols), []
    errors = []
    g = torch.Generator(device=DEV).manual_seed(0)
    done = []  # (cells, {kernel column: fn}, inputs) of each row, for the kernel counts
    for name, expr, specs, fn, flops in rows(quick):
        log(f"{name} ...")
        text = ", ".join(f"{n}: {DT[d]}[{','.join(map(str, s))}]" for n, s, d in specs)
        cells, fns = [name, f"`{expr}`", text], {}
        try:
            inputs = [torch.randn(s, device=DEV, generator=g).to(d) for _, s, d in specs]
            dt = DT[specs[0][2]]
            ref = (copy, peaks.get(dt), dt)
        except Exception as e:  # noqa: BLE001
            errors.append(f"{name}: inputs: {type(e).__name__}: {e}")
            table.append(cells + ["error"] * 9)
            continue
        for mode in ("eager", "compile"):
            try:
                f, extra = fn, []
                if mode == "compile":
                    f = torch.compile(fn, dynamic=False)
                    t = time.perf_counter()
                    f(*inputs)
                    sync()
                    extra = [f"{time.perf_counter() - t:.1f}"]
                ms, rate, frac = run_mode(f, inputs, flops, ref, quick)
                cells += [f"{ms:.3f}", rate, frac, ""] + extra
                fns[len(cells) - 1 - len(extra)] = f
            except Exception as e:  # noqa: BLE001 -- one failure must not stop the rest
                msg = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
                errors.append(f"{name} {mode}: {type(e).__name__}: {msg}")
                cells += ["error"] * (4 if mode == "eager" else 5)
                log(f"  {name} {mode} failed: {type(e).__name__}")
        table.append(cells)
        done.append((cells, fns, inputs))

    # Kernel counts last, so the profiler cannot disturb any timing.
    if CUDA:
        log("kernel counts ...")
        for cells, fns, inputs in done:
            for col, f in fns.items():
                k = count_kernels(lambda: f(*inputs))
                cells[col] = "" if k is None else str(k)
    del done
    table = [header, rule] + ["| " + " | ".join(c) + " |" for c in table]

    notes = ["", "rate: GB/s of ideal bytes (inputs once + output once) or TFLOP/s of "
             "2*M*N*K; of: fraction of the copy bandwidth or of the dtype's matmul peak; "
             "k: device activities per call (kernels, memsets, copies) from the profiler; "
             "compile s: the first compiled call."]
    if errors:
        notes += ["", "errors:"] + [f"- {e}" for e in errors]
    notes.append(f"\ntotal {time.perf_counter() - start:.0f} s")
    report = "\n".join(["# PyTorch peers of `ndfuse bench --backend cuda`", ""]
                       + [f"- {h}" for h in head] + [""] + table + notes) + "\n"
    print(report, end="", flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(report)


if __name__ == "__main__":
    main()
