#!/usr/bin/env python3
"""Peer timings for the LAPACK rows of the benchmark: numpy.linalg (OpenBLAS's LAPACK in
the PyPI wheel), scipy.linalg (the same OpenBLAS) and torch.linalg (CPU; MKL's LAPACK in
the PyPI wheel), on the ndfuse `linalg` rows:

    python3 -m venv /tmp/peers-venv
    /tmp/peers-venv/bin/pip install numpy scipy torch threadpoolctl
    /tmp/peers-venv/bin/python scripts/linalg_peers.py [--quick] [--json [FILE]] \
        [--threads 2] [--rows solve_f64,qr_f32] [--peers numpy,torch]

Rows (f64 and f32 each, inputs N(0, 1) from a seeded numpy Generator, built and
converted outside the timed region; f32 inputs are the f64 ones rounded):

    solve_<dt>     a [1024, 1024] @ x = b [1024, 1]      numpy/scipy solve, torch.linalg.solve
    solve64_<dt>   the same with b [1024, 64]
    cholesky_<dt>  a @ a.T + n I, lower factor            (scipy: lower=True)
    qr_<dt>        reduced Q and R of a [1024, 1024]      (scipy: mode='economic')
    inv_<dt>       a^-1
    det_<dt>       det(a)
    svd_<dt>       u, s, vh of a [512, 512], full_matrices=False (gesdd in all three)
    eigh_<dt>      eigenvalues and vectors of (a + a.T) / 2, [512, 512]
    solve_batched_<dt>   1024 systems of [32, 32] with one right-hand side each, in one
                   call (numpy loops gesv in C; scipy >= 1.15 batches in C; torch batches)

numpy.linalg computes in double whatever the input (its `_commonType`: f32 is cast to
f64, run through dgesv/dpotrf/..., and rounded back), so numpy's _f32 rows time f64 LAPACK
plus two casts; scipy and torch call the single-precision routines (sgesv...).
scipy is called with check_finite=False (its default scans the inputs for NaN/inf first;
numpy and torch do not) and its default drivers otherwise (eigh: syevr; svd: gesdd).

Flops (for GFLOP/s; LAWN 41's operation counts for square n x n, k right-hand sides):
    getrf 2n^3/3; getrs 2n^2 k; so solve = 2n^3/3 + 2n^2 k (gesv)
    potrf n^3/3
    geqrf 4n^3/3 (the factorization only: the three peers also form the reduced Q,
        orgqr's another 4n^3/3, inside the time, so qr's GFLOP/s is conservative)
    inv = getrf + getri = 2n^3/3 + 4n^3/3 = 2n^3 (the count of the minimal LAPACK path;
        numpy and torch solve against I, 8n^3/3 flops, but the row counts 2n^3)
    det = getrf = 2n^3/3
    svd: 22 n^3 (the conventional count for U, S and V), eigh: 9 n^3 (the conventional
        count of syevd with vectors): conventions, for comparing rows, not exact counts
    solve_batched: count * (2 * 32^3/3 + 2 * 32^2)

Protocol: per row and peer, one first call (not counted), `warmup` more calls, then N
timed calls, N = clamp(budget / first-call time, min_runs, max_runs) (full: 2 warm-up,
budget 3 s, 5..30 runs; --quick: 1 warm-up, 3 runs); each timed call blocks until its
result is there (CPU). The table gives the minimum and the median in ms, and GFLOP/s at
the median. --quick shrinks the sizes (n 128, svd/eigh 64, 64 batched systems) for a
smoke test: not comparable with the full rows. BLAS threads are set to --threads
(default 2: this machine's cores) through threadpoolctl when present and the
OPENBLAS/MKL/OMP_NUM_THREADS variables (set before numpy is imported), and
torch.set_num_threads. Run it when nothing else is busy; the load average at the start
and end is printed. A missing library or a failing peer prints n/a and the reason.
Markdown on stdout (or JSON with --json; --json FILE writes the JSON there and prints
the table), progress on stderr.
"""
import argparse
import datetime
import json
import math
import os
import platform
import statistics
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes, 3 runs: a smoke test")
    p.add_argument("--json", nargs="?", const="-", default=None, metavar="FILE",
                   help="JSON output: on stdout (no FILE) instead of the table, or to FILE")
    p.add_argument("--threads", type=int, default=2, help="BLAS/torch threads (default 2)")
    p.add_argument("--rows", default="", help="comma-separated row names (default: all)")
    p.add_argument("--peers", default="numpy,scipy,torch", help="comma-separated peers")
    return p.parse_args()


ARGS = parse_args()
for var in ["OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"]:
    os.environ[var] = str(ARGS.threads)

import numpy as np  # noqa: E402  (after the thread variables)

SKIPPED = {}  # peer -> why it is missing
try:
    import scipy
    import scipy.linalg as sla
except Exception as e:  # noqa: BLE001
    scipy = sla = None
    SKIPPED["scipy"] = f"{type(e).__name__}: {e}"
try:
    import torch
    torch.set_num_threads(ARGS.threads)
except Exception as e:  # noqa: BLE001 -- e.g. a CUDA wheel without its nvidia-* libraries
    torch = None
    SKIPPED["torch"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
try:
    from threadpoolctl import threadpool_info, threadpool_limits
    threadpool_limits(ARGS.threads)
except Exception:  # noqa: BLE001 -- the environment variables then do it
    threadpool_info = None

PEERS = ["numpy", "scipy", "torch"]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# ---- Rows: name -> (kind, dtype, sizes, flops). ----
def rows(quick):
    n, ns, count = (128, 64, 64) if quick else (1024, 512, 1024)
    out = []
    for dt in ["f64", "f32"]:
        out += [
            (f"solve_{dt}", "solve", dt, dict(n=n, k=1), 2 * n**3 / 3 + 2 * n**2 * 1),
            (f"solve64_{dt}", "solve", dt, dict(n=n, k=64), 2 * n**3 / 3 + 2 * n**2 * 64),
            (f"cholesky_{dt}", "cholesky", dt, dict(n=n), n**3 / 3),
            (f"qr_{dt}", "qr", dt, dict(n=n), 4 * n**3 / 3),
            (f"inv_{dt}", "inv", dt, dict(n=n), 2 * n**3),
            (f"det_{dt}", "det", dt, dict(n=n), 2 * n**3 / 3),
            (f"svd_{dt}", "svd", dt, dict(n=ns), 22 * ns**3),
            (f"eigh_{dt}", "eigh", dt, dict(n=ns), 9 * ns**3),
        ]
    for dt in ["f32", "f64"]:
        out.append((f"solve_batched_{dt}", "solve_batched", dt, dict(n=32, k=1, count=count),
                    count * (2 * 32**3 / 3 + 2 * 32**2)))
    return out


def inputs(kind, dt, size, seed=0):
    """numpy arrays for one row, built before any timing."""
    rng = np.random.default_rng(seed)
    n = size["n"]
    f = np.float64 if dt == "f64" else np.float32
    if kind == "solve":
        return [rng.standard_normal((n, n)).astype(f), rng.standard_normal((n, size["k"])).astype(f)]
    if kind == "solve_batched":
        c = size["count"]
        return [rng.standard_normal((c, n, n)).astype(f),
                rng.standard_normal((c, n, size["k"])).astype(f)]
    a = rng.standard_normal((n, n))
    if kind == "cholesky":
        a = a @ a.T + n * np.eye(n)
    elif kind == "eigh":
        a = (a + a.T) / 2
    return [np.ascontiguousarray(a.astype(f))]


def numpy_fn(kind):
    L = np.linalg
    return {
        "solve": L.solve, "solve_batched": L.solve, "cholesky": L.cholesky,
        "qr": lambda a: L.qr(a, mode="reduced"), "inv": L.inv, "det": L.det,
        "svd": lambda a: L.svd(a, full_matrices=False), "eigh": L.eigh,
    }[kind]


def scipy_fn(kind):
    cf = dict(check_finite=False)
    return {
        "solve": lambda a, b: sla.solve(a, b, **cf),
        "solve_batched": lambda a, b: sla.solve(a, b, **cf),
        "cholesky": lambda a: sla.cholesky(a, lower=True, **cf),
        "qr": lambda a: sla.qr(a, mode="economic", **cf),
        "inv": lambda a: sla.inv(a, **cf),
        "det": lambda a: sla.det(a, **cf),
        "svd": lambda a: sla.svd(a, full_matrices=False, **cf),
        "eigh": lambda a: sla.eigh(a, **cf),
    }[kind]


def torch_fn(kind):
    L = torch.linalg
    return {
        "solve": L.solve, "solve_batched": L.solve, "cholesky": L.cholesky,
        "qr": lambda a: L.qr(a, mode="reduced"), "inv": L.inv, "det": L.det,
        "svd": lambda a: L.svd(a, full_matrices=False), "eigh": L.eigh,
    }[kind]


def setup(peer, kind, arrays):
    """() -> blocking callable for one peer on one row's arrays."""
    if peer in SKIPPED:
        raise RuntimeError(SKIPPED[peer])
    if peer == "numpy":
        f = numpy_fn(kind)
        return lambda: f(*arrays)
    if peer == "scipy":
        f = scipy_fn(kind)
        return lambda: f(*arrays)
    xs = [torch.from_numpy(a) for a in arrays]
    f = torch_fn(kind)
    return lambda: f(*xs)  # CPU: the call returns when the result is there


def timed(call, quick):
    """(min ms, median ms, runs) after a first call and warm-ups."""
    t = time.perf_counter()
    call()
    first = time.perf_counter() - t
    warmup, budget, lo, hi = (1, 0.0, 3, 3) if quick else (2, 3.0, 5, 30)
    for _ in range(warmup):
        call()
    runs = max(lo, min(hi, math.ceil(budget / max(first, 1e-9)))) if budget else lo
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        call()
        times.append((time.perf_counter() - t) * 1e3)
    return min(times), statistics.median(times), runs


def machine():
    model = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info = {
        "cpu": model,
        "cores": os.cpu_count(),
        "threads": ARGS.threads,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "scipy": None if scipy is None else scipy.__version__,
        "torch": None if torch is None else torch.__version__,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "quick": ARGS.quick,
    }
    try:
        deps = np.show_config(mode="dicts")["Build Dependencies"]["lapack"]
        info["numpy_lapack"] = f"{deps.get('name', '?')} {deps.get('version', '')}".strip()
    except Exception:  # noqa: BLE001
        pass
    if torch is not None:
        cfg = torch.__config__.show()
        info["torch_lapack"] = "MKL" if "Math Kernel Library" in cfg else "see torch.__config__"
    if threadpool_info is not None:
        info["blas_pools"] = sorted({f"{p.get('internal_api')}:{p.get('num_threads')}"
                                     for p in threadpool_info()})
    return info


def main():
    want_rows = {r for r in ARGS.rows.split(",") if r}
    peers = [p for p in ARGS.peers.split(",") if p]
    unknown = set(peers) - set(PEERS)
    if unknown:
        sys.exit(f"unknown peers {sorted(unknown)} (known: {PEERS})")
    load0 = os.getloadavg()
    info = machine()
    log(f"{info['cpu']}, {info['cores']} cores, {ARGS.threads} threads; "
        f"load average {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}")
    for p, why in SKIPPED.items():
        log(f"{p}: n/a ({why})")
    results = []
    all_rows = rows(ARGS.quick)
    if want_rows - {r[0] for r in all_rows}:
        sys.exit(f"unknown rows {sorted(want_rows - {r[0] for r in all_rows})}")
    for name, kind, dt, size, flops in all_rows:
        if want_rows and name not in want_rows:
            continue
        arrays = inputs(kind, dt, size)
        row = {"row": name, "dtype": dt, **size, "flops": flops, "peers": {}}
        for peer in peers:
            try:
                call = setup(peer, kind, arrays)
                lo, med, runs = timed(call, ARGS.quick)
                row["peers"][peer] = {"min_ms": lo, "median_ms": med, "runs": runs,
                                      "gflops": flops / (med * 1e-3) / 1e9}
                log(f"{name:<18} {peer:<6} min {lo:9.3f} ms  median {med:9.3f} ms  ({runs} runs)")
            except Exception as e:  # noqa: BLE001
                row["peers"][peer] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
                log(f"{name:<18} {peer:<6} n/a ({type(e).__name__}: {e})")
        results.append(row)
    load1 = os.getloadavg()
    info["loadavg_start"], info["loadavg_end"] = list(load0), list(load1)
    doc = {"machine": info, "skipped": SKIPPED, "rows": results,
           "protocol": "first call, warm-up, then N timed calls: min and median ms; "
                       "GFLOP/s at the median, LAWN 41 counts (svd 22n^3, eigh 9n^3 "
                       "conventions)"}
    if ARGS.json == "-":
        print(json.dumps(doc, indent=1))
        return
    if ARGS.json:
        with open(ARGS.json, "w") as f:
            json.dump(doc, f, indent=1)
        log(f"wrote {ARGS.json}")
    print(f"LAPACK peers: {info['cpu']}, {info['cores']} cores, {ARGS.threads} threads, "
          f"{info['date']}{' (--quick sizes)' if ARGS.quick else ''}")
    print(f"numpy {info['numpy']} ({info.get('numpy_lapack', '?')}), scipy {info['scipy']}, "
          f"torch {info['torch']} ({info.get('torch_lapack', '?')}); load average "
          f"{load0[0]:.2f} at start, {load1[0]:.2f} at end")
    print()
    print("| row | size | peer | min ms | median ms | GFLOP/s (median) |")
    print("|---|---|---|---:|---:|---:|")
    for row in results:
        size = (f"{row['count']} x {row['n']}^2, k {row['k']}" if "count" in row
                else f"n {row['n']}" + (f", k {row['k']}" if "k" in row else ""))
        for peer, r in row["peers"].items():
            if "error" in r:
                print(f"| {row['row']} | {size} | {peer} | n/a | n/a | {r['error']} |")
            else:
                print(f"| {row['row']} | {size} | {peer} | {r['min_ms']:.3f} | "
                      f"{r['median_ms']:.3f} | {r['gflops']:.1f} |")


if __name__ == "__main__":
    main()
