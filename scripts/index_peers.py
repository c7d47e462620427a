#!/usr/bin/env python3
"""numpy on the same rows as `ndfuse bench embedding scan_rows argsort` (issue 29's
figures), on the same shapes and data distributions: the peers the bench's RESULTS
entry sets ndfuse's times against. Prints one line per row: the median of 10 runs, ms.

    python3 scripts/index_peers.py          # needs numpy (pip install numpy)

OPENBLAS_CORETYPE and friends do not matter here (no BLAS call).
"""
import statistics
import time

import numpy as np


def median_ms(f, runs=10):
    f()  # warm: page faults, caches
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        f()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main():
    rng = np.random.default_rng(1)
    emb = rng.uniform(-1, 1, (50304, 768)).astype(np.float32)
    pos = rng.uniform(-1, 1, (512, 768)).astype(np.float32)
    tokens = rng.integers(0, 1 << 15, (64, 512), dtype=np.int64)
    ar = np.arange(512)
    print(f"embedding take(emb, tokens)*8 + take(pos, arange(T)): "
          f"{median_ms(lambda: np.take(emb, tokens, axis=0) * 8 + np.take(pos, ar, axis=0)):.1f} ms")
    x = rng.uniform(-1, 1, (4096, 4096)).astype(np.float32)
    print(f"cumsum(x, axis=1) [4096,4096] f32: {median_ms(lambda: np.cumsum(x, axis=1)):.1f} ms")
    keys = rng.uniform(-1, 1, 1 << 22).astype(np.float32)
    print(f"argsort(kind='stable') 2^22 f32: "
          f"{median_ms(lambda: np.argsort(keys, kind='stable'), runs=5):.1f} ms")


if __name__ == "__main__":
    main()
