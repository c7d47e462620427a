#!/usr/bin/env python3
"""numpy, jax.jit, PyTorch eager and torch.compile on the CPU, on the product rows of
`ndfuse bench` (matmul_f32, matmul_gelu, matmul_bf16, attention, train_step_mlp), with the
same shapes, so that a comparison is one command beside the bench:

    python3 -m venv /tmp/peers-venv
    /tmp/peers-venv/bin/pip install numpy "jax[cpu]" torch threadpoolctl
    /tmp/peers-venv/bin/python scripts/cpu_peers.py [--quick] [--out FILE] \
        [--peak-gflops G] [--rows matmul_f32,attention]

PyPI's torch is a CUDA build: it imports (and runs on the CPU) only with its nvidia-*
wheels, about 4 GB; a CPU-only torch wheel, where one can be had, is enough. Run it when
nothing else is busy: on 2 cores one cargo build slows threaded BLAS many-fold (the report
prints the load average at start and end).

Shapes are the CPU's of bench/src/cases.rs (`Size::Full`, gpu = false) and
bench/src/training.rs: 2048^3 f32 and bf16 products; gelu(x @ w + b) on x[4096,1024],
w[1024,4096] (tanh gelu, as ndfuse's `Tensor::gelu`), with the bare product for the
epilogue's cost; attention over 32 heads of [256, 64]; one Adam step of a 784-512-512-10
ReLU MLP on batch 128 (He-uniform weights, zero biases, mean softmax cross-entropy on
labels i % 10, Adam lr 1e-3, betas (0.9, 0.999), eps 1e-8). Inputs are uniform in [-1, 1)
(the bench's distribution, not its values). Each timing: the first call (jit/compile),
warm-up calls, then the median of 10 runs (3 with --quick, which also divides matrix
sides, heads, batch and hidden widths by 4: not comparable with the bench's rows).
GFLOP/s count 2*M*N*K per product; --peak-gflops (the bench's FMA peak line) adds the
fraction. A missing library or a failing peer prints n/a and the reason. Markdown on
stdout, progress on stderr.
"""
import argparse
import math
import os
import platform
import statistics
import sys
import time

import numpy as np

SKIPPED = {}  # library -> why it is missing
try:
    import jax
    import jax.numpy as jnp
except Exception as e:  # noqa: BLE001
    jax = jnp = None
    SKIPPED["jax"] = f"{type(e).__name__}: {e}"
try:
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(os.cpu_count())
    # Compile in this process: inductor's pool of compile workers would otherwise start
    # (importing torch, for seconds) while later rows are being timed.
    try:
        import torch._inductor.config
        torch._inductor.config.compile_threads = 1
    except Exception:  # noqa: BLE001 -- torch.compile then fails in its rows, with a reason
        pass
except Exception as e:  # noqa: BLE001 -- e.g. a CUDA wheel without its nvidia-* libraries
    torch = F = None
    SKIPPED["torch"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
try:
    import ml_dtypes  # numpy's bfloat16 (comes with jax)
except ImportError:
    ml_dtypes = None

PEERS = ["numpy", "jax.jit", "torch eager", "torch.compile"]
GELU_C = math.sqrt(2 / math.pi)


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def timed(call, warmup, runs):
    """(first call s, median ms of `runs` calls after `warmup` more): call() must block."""
    t = time.perf_counter()
    call()
    first = time.perf_counter() - t
    for _ in range(warmup):
        call()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        call()
        times.append((time.perf_counter() - t) * 1e3)
    return first, statistics.median(times)


# ---- The rows' functions, one per library. ----
def np_gelu(x):  # tanh form
    return 0.5 * x * (1 + np.tanh(np.float32(GELU_C) * (x + np.float32(0.044715) * x * x * x)))


def np_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


NUMPY = {
    "matmul": lambda x, w: x @ w,
    "matmul_gelu": lambda x, w, b: np_gelu(x @ w + b),
    "attention": lambda q, k, v: np_softmax(q @ k.transpose(0, 2, 1) / np.float32(8)) @ v,
}
JAX = {
    "matmul": lambda x, w: x @ w,
    "matmul_gelu": lambda x, w, b: jax.nn.gelu(x @ w + b, approximate=True),
    "attention": lambda q, k, v: jax.nn.softmax(q @ k.transpose(0, 2, 1) / 8, axis=-1) @ v,
}
TORCH = {
    "matmul": lambda x, w: x @ w,
    "matmul_gelu": lambda x, w, b: F.gelu(x @ w + b, approximate="tanh"),
    "attention": lambda q, k, v: torch.softmax(q @ k.transpose(-1, -2) / 8, dim=-1) @ v,
}


def expression_setups(fn, arrays, bf16):
    """{peer: () -> blocking callable} for one expression on numpy f32 `arrays`."""
    def numpy_peer():
        # ml_dtypes' bfloat16: matmul casts to f32 and calls sgemm (f32 result).
        xs = [a.astype(ml_dtypes.bfloat16) for a in arrays] if bf16 else arrays
        return lambda: NUMPY[fn](*xs)

    def jax_peer():
        xs = [jnp.asarray(a, dtype=jnp.bfloat16 if bf16 else jnp.float32) for a in arrays]
        f = jax.jit(JAX[fn])
        return lambda: jax.block_until_ready(f(*xs))

    def torch_peer(compiled):
        xs = [torch.from_numpy(a).to(torch.bfloat16 if bf16 else torch.float32) for a in arrays]
        f = torch.compile(TORCH[fn], dynamic=False) if compiled else TORCH[fn]
        return lambda: f(*xs)  # CPU: the call returns when the result is there

    peers = {"numpy": numpy_peer, "jax.jit": jax_peer,
             "torch eager": lambda: torch_peer(False), "torch.compile": lambda: torch_peer(True)}
    if bf16 and ml_dtypes is None:
        del peers["numpy"]  # numpy has no bf16 of its own
    return peers


# ---- train_step_mlp: forward, mean cross-entropy, backward, Adam. ----
ADAM = dict(lr=1e-3, b1=0.9, b2=0.999, eps=1e-8)


def mlp_data(widths, batch, seed=1):
    """He-uniform weights [in, out] (a = sqrt(6 / fan_in)), zero biases, N(0, 1) features,
    labels i % classes: Sequential::mlp and training.rs's data()."""
    rng = np.random.default_rng(seed)
    params = []
    for fi, fo in zip(widths[:-1], widths[1:]):
        a = math.sqrt(6 / fi)
        params += [rng.uniform(-a, a, (fi, fo)).astype(np.float32), np.zeros(fo, np.float32)]
    x = rng.standard_normal((batch, widths[0])).astype(np.float32)
    y = np.arange(batch) % widths[-1]
    return params, x, y


def jax_train(params, x, y):
    def loss_fn(ps, x, y):
        h = x
        for i in range(0, len(ps), 2):
            h = h @ ps[i] + ps[i + 1]
            if i + 2 < len(ps):
                h = jax.nn.relu(h)
        logp = jax.nn.log_softmax(h, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=-1))

    def step(ps, m, v, t, x, y):  # Adam as torch.optim.Adam (bias-corrected, no decay)
        loss, g = jax.value_and_grad(loss_fn)(ps, x, y)
        t = t + 1
        b1, b2 = ADAM["b1"], ADAM["b2"]
        m = [b1 * mi + (1 - b1) * gi for mi, gi in zip(m, g)]
        v = [b2 * vi + (1 - b2) * gi * gi for vi, gi in zip(v, g)]
        c1, c2 = 1 - b1 ** t, 1 - b2 ** t
        ps = [p - ADAM["lr"] * (mi / c1) / (jnp.sqrt(vi / c2) + ADAM["eps"])
              for p, mi, vi in zip(ps, m, v)]
        return ps, m, v, t, loss

    f = jax.jit(step, donate_argnums=(0, 1, 2))
    st = {"s": ([jnp.asarray(p) for p in params], [jnp.zeros(p.shape) for p in params],
                [jnp.zeros(p.shape) for p in params], jnp.float32(0)),
          "loss": None}
    xj, yj = jnp.asarray(x), jnp.asarray(y, dtype=jnp.int32)

    def call():
        *s, loss = f(*st["s"], xj, yj)
        st["s"], st["loss"] = tuple(s), float(loss)  # the loss to the host, as ndfuse's step
    return call, st


def torch_train(params, x, y, compiled):
    ps = [torch.tensor(p, requires_grad=True) for p in params]
    opt = torch.optim.Adam(ps, lr=ADAM["lr"], betas=(ADAM["b1"], ADAM["b2"]), eps=ADAM["eps"])
    xt, yt = torch.from_numpy(x), torch.from_numpy(y).long()

    def loss_fn(x, y):
        h = x
        for i in range(0, len(ps), 2):
            h = h @ ps[i] + ps[i + 1]
            if i + 2 < len(ps):
                h = torch.relu(h)
        return F.cross_entropy(h, y)

    lf, opt_step = loss_fn, opt.step
    if compiled:  # forward + backward through AOTAutograd, and the optimiser's step
        lf = torch.compile(loss_fn, dynamic=False)
        opt_step = torch.compile(lambda: opt.step())
    st = {"loss": None}

    def call():
        opt.zero_grad(set_to_none=True)
        loss = lf(xt, yt)
        loss.backward()
        opt_step()
        st["loss"] = loss.item()
    return call, st


# ---- Rows. ----
def rows(quick):
    """(name, expression, inputs text, flops, kind, arrays or MLP shape, bf16)."""
    d = 4 if quick else 1
    rng = np.random.default_rng(0)
    u = lambda *s: rng.uniform(-1, 1, s).astype(np.float32)  # noqa: E731
    sq, (gm, gn, gk) = 2048 // d, (4096 // d, 4096 // d, 1024 // d)
    heads, seq, dim = 32 // d, 256, 64
    widths, batch = [784, 512 // d, 512 // d, 10], 128 // d
    l1, l2, l3 = zip(widths[:-1], widths[1:])
    # Shape::step_flops: forward and weight-gradient products of 3 layers, input
    # gradients of layers 2 and 3 (784-512-512-10 on 128: 410,779,648).
    step_flops = 2 * batch * (2 * sum(a * b for a, b in (l1, l2, l3))
                              + l2[0] * l2[1] + l3[0] * l3[1])
    mm = [u(sq, sq), u(sq, sq)]
    return [
        ("matmul_f32", "x @ w", f"f32 x[{sq},{sq}], w[{sq},{sq}]", 2 * sq ** 3, "matmul", mm,
         False),
        ("matmul_gelu", "gelu_tanh(x @ w + b)", f"f32 x[{gm},{gk}], w[{gk},{gn}], b[{gn}]",
         2 * gm * gn * gk, "matmul_gelu", [u(gm, gk), u(gk, gn), u(gn)], False),
        ("matmul_bf16", "x @ w", f"bf16 x[{sq},{sq}], w[{sq},{sq}]", 2 * sq ** 3, "matmul", mm,
         True),
        ("attention", "softmax(q @ k^T / 8, axis=-1) @ v", f"f32 q,k,v[{heads},{seq},{dim}]",
         4 * heads * seq * seq * dim, "attention", [u(heads, seq, dim) for _ in range(3)], False),
        ("train_step_mlp", "fwd + mean CE + bwd + Adam", f"{'-'.join(map(str, widths))} relu, "
         f"batch {batch}", step_flops, "train", (widths, batch), False),
    ]


def reference(kind, arrays, bf16):
    """numpy f64 result of the expression (bf16 inputs rounded first), for the error."""
    if bf16:
        if ml_dtypes is None:
            return None
        arrays = [a.astype(ml_dtypes.bfloat16).astype(np.float32) for a in arrays]
    return NUMPY[kind](*[a.astype(np.float64) for a in arrays])


def rel_err(out, ref):
    if ref is None:
        return ""
    out = np.asarray(out.float().detach() if torch is not None and isinstance(out, torch.Tensor)
                     else out, dtype=np.float64)
    return f"err {np.abs(out - ref).max() / max(np.abs(ref).max(), 1e-30):.0e}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="sides 4x smaller, 3 runs")
    ap.add_argument("--out", help="also write the markdown report to this file")
    ap.add_argument("--peak-gflops", type=float, help="this machine's f32 FMA peak, GFLOP/s")
    ap.add_argument("--rows", help="comma-separated row names (default: all)")
    args = ap.parse_args()
    runs, warmup = (3, 1) if args.quick else (10, 3)
    start = time.perf_counter()

    head = [f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; "
            f"python {platform.python_version()}"]
    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    try:  # the kernel OpenBLAS picked at run time, if threadpoolctl is there
        from threadpoolctl import threadpool_info
        core = ", ".join(f"{i['internal_api']} {i.get('architecture')} {i['num_threads']} threads"
                         for i in threadpool_info() if i["user_api"] == "blas")
    except ImportError:
        core = "threadpoolctl not installed"
    head.append(f"numpy {np.__version__}: BLAS {blas.get('name')} {blas.get('version')} ({core})")
    for var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OMP_NUM_THREADS"):
        if var in os.environ:
            head.append(f"warning: {var}={os.environ[var]} is set (it changes the BLAS or threads)")
    head.append(f"jax {jax.__version__}, {jax.devices()[0].platform}" if jax else
                f"jax: missing ({SKIPPED['jax']})")
    head.append(f"torch {torch.__version__}, {torch.get_num_threads()} threads"
                if torch else f"torch: missing ({SKIPPED['torch']})")
    head.append(f"ml_dtypes {ml_dtypes.__version__}: numpy's bf16 (matmul: cast to f32 + sgemm)"
                if ml_dtypes else "ml_dtypes: missing (numpy skips bf16)")
    head.append(f"timing: first call, {warmup} warm-up calls, median of {runs} runs")
    # On 2 cores one busy process (a cargo build) slows threaded BLAS and OpenMP many-fold.
    head.append("load average at start: %.2f %.2f %.2f" % os.getloadavg())
    if args.quick:
        head.append("sizes: --quick (sides 4x smaller), not comparable with the bench's rows")

    cols = ["row", "peer", "median ms", "GFLOP/s", "of peak", "first call s", "note"]
    table = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    legend, errors = [], []
    want = set(args.rows.split(",")) if args.rows else None
    if want and want - {r[0] for r in rows(True)}:
        ap.error(f"unknown rows: {', '.join(sorted(want - {r[0] for r in rows(True)}))}")
    for name, expr, inputs, flops, kind, data, bf16 in rows(args.quick):
        if want and name not in want:
            continue
        legend.append(f"- {name}: `{expr}`; {inputs}; {flops / 1e9:.3f} GFLOP")
        if kind == "train":
            params, x, y = mlp_data(*data)
            setups = {"jax.jit": lambda: jax_train(params, x, y),
                      "torch eager": lambda: torch_train(params, x, y, False),
                      "torch.compile": lambda: torch_train(params, x, y, True)}
            ref = None
        else:
            setups = expression_setups(kind, data, bf16)
            ref = reference(kind, data, bf16)
            if kind == "matmul_gelu":  # the bare product, for the epilogue's cost
                bare = expression_setups("matmul", data[:2], bf16)
        for peer in PEERS:
            lib = peer.split(".")[0].split(" ")[0]
            cells = [name, peer]
            if peer not in setups:
                why = ("no training step in numpy" if kind == "train"
                       else "no bf16 (ml_dtypes missing)")
                table.append("| " + " | ".join(cells + ["n/a"] * 4 + [why]) + " |")
                continue
            if lib in SKIPPED:
                table.append("| " + " | ".join(cells + ["n/a"] * 4 + [f"{lib} missing"]) + " |")
                continue
            log(f"{name} {peer} ...")
            try:
                made = setups[peer]()
                call, state = made if kind == "train" else (made, None)
                first, ms = timed(call, warmup, runs)
                gflops = flops / (ms * 1e-3) / 1e9
                frac = f"{100 * gflops / args.peak_gflops:.0f}%" if args.peak_gflops else ""
                notes = []
                if kind == "train":
                    notes.append(f"loss {state['loss']:.4f}")
                else:
                    notes.append(rel_err(call(), ref))
                if kind == "matmul_gelu":
                    _, bare_ms = timed(bare[peer](), warmup, runs)
                    notes.append(f"bare x @ w {bare_ms:.2f} ms, epilogue/bare {ms / bare_ms:.2f}")
                if bf16 and peer == "numpy":
                    notes.append("ml_dtypes bf16: cast to f32 + sgemm, f32 result")
                if peer == "torch.compile" and kind == "train":
                    notes.append("compiled loss fwd/bwd + compiled opt.step")
                cells += [f"{ms:.3f}", f"{gflops:.1f}", frac, f"{first:.2f}",
                          "; ".join(n for n in notes if n)]
            except Exception as e:  # noqa: BLE001 -- one failure must not stop the rest
                msg = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
                errors.append(f"{name} {peer}: {type(e).__name__}: {msg}")
                log(f"  {name} {peer} failed: {type(e).__name__}: {msg}")
                short = msg[:80].replace("|", "/")  # a table cell: no pipes
                cells += ["n/a"] * 4 + [f"failed: {type(e).__name__}: {short} (see errors)"]
            table.append("| " + " | ".join(cells) + " |")

    notes = ["", "rows:"] + legend
    notes += ["", "GFLOP/s: 2*M*N*K per product (train_step_mlp: the products of forward and "
              "backward, as Shape::step_flops); of peak: over --peak-gflops; first call s: "
              "the first call (jit trace + compile for jax.jit and torch.compile); err: max "
              "|out - ref| / max |ref| against numpy in f64 (bf16: on the rounded inputs). "
              "gelu is the tanh form (ndfuse's Tensor::gelu), in every peer."]
    if errors:
        notes += ["", "errors:"] + [f"- {e}" for e in errors]
    notes.append(f"\ntotal {time.perf_counter() - start:.0f} s; load average at end: "
                 + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    report = "\n".join(["# CPU peers of `ndfuse bench`", ""] + [f"- {h}" for h in head] + [""]
                       + table + notes) + "\n"
    print(report, end="", flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(report)


if __name__ == "__main__":
    main()
