#!/usr/bin/env python3
"""numpy's and scipy's LAPACK results on a handful of small matrices, as one JSON fixture
for tests/tests/linalg_numpy.rs (the `ndfuse::linalg` level against numpy).

    /tmp/peers-venv/bin/python scripts/linalg_fixtures.py   # any Python with numpy + scipy

Writes tests/fixtures/linalg_numpy.json. Made with numpy 2.4, scipy 1.17 (OpenBLAS
0.3.31), Python 3.11; the exact versions used are recorded in the file's "meta". The
inputs come from a seeded `np.random.default_rng`, so a rerun with another numpy/LAPACK
changes only the last bits of the results, never the inputs (the generator is pinned by
the seed; `Generator` streams are stable across numpy versions).

Format: {"meta": {...}, "arrays": {name: {"shape": [...], "data": [...]}}}, one array per
line, row-major, every number float64 written with Python's `repr` (shortest round-trip:
parsing it gives back the same double). Non-finite values are the strings "inf", "-inf"
and "nan" (JSON has no such numbers): sing4/slogdet_logabsdet is "-inf". A scalar has
shape [].

Names: an input is `<input>` (wc4, batch3, spd5, sym4, tall, wide, rankdef, ill6, tri5,
plus sym4_junk_upper / sym4_junk_lower: sym4 with garbage in the triangle that eigvalsh
must not read, and sing4: rows 1..5 of rankdef, exactly singular, whose LU meets exact
zero pivots before the last one: det 0, slogdet (0, -inf), numpy's solve raises);
results are `<input>/<what>`:

  kappa            2-norm condition number s_max / s_min (rankdef: s_1 / s_rank; tri5:
                   the largest over the triangles solved with; none for sing4) -- the
                   tests' tolerances
  solve_b, solve   np.linalg.solve(a, b) with a matrix b [..., n, k]
  solve_vb, solve_v  the same with a 1-D b [n] (numpy 2 reads only a 1-D b as a vector)
  inv, det, slogdet_sign, slogdet_logabsdet
  cholesky         np.linalg.cholesky (lower)
  eigvalsh         np.linalg.eigvalsh (ascending; UPLO='L')
  eigh_v           np.linalg.eigh's eigenvectors (LAPACK's signs: compare |V^T V_np|)
  svdvals          np.linalg.svd(a, compute_uv=False)
  svd_u, svd_vh    np.linalg.svd(a, full_matrices=False)'s vectors (LAPACK's signs)
  qr_q, qr_r       np.linalg.qr(a) (reduced; LAPACK's signs: compare |Q|, |R|)
  lu_p, lu_l, lu_u scipy.linalg.lu (a = p l u; partial pivoting makes it unique: no ties
                   in these inputs)
  pinv             np.linalg.pinv(a, rtol=None): the Array API cutoff max(m, n) eps,
                   ndfuse's default (numpy's own default is 1e-15)
  lstsq_b, lstsq_x, lstsq_rank, lstsq_s, lstsq_res   np.linalg.lstsq(a, b, rcond=None)
                   (cutoff max(m, n) eps); lstsq_res only where numpy returns residuals
                   (full rank and m > n); lstsq_vb, lstsq_vx, lstsq_vres for a 1-D b
  norm_<ord>       np.linalg.matrix_norm(a, ord=...) for fro, nuc, 2, -2, 1, -1, inf, -inf
  cond_none, cond_1, cond_inf   np.linalg.cond(a, p) (1 and inf only for square a)
  tri_b, tri_lower, tri_upper, tri_unit_lower   scipy.linalg.solve_triangular(a, b,
                   lower=..., unit_diagonal=...) reading one triangle of a full matrix
  tri_rb, tri_right_upper   x with x @ triu(a) = rb (solve_triangular(a, rb.T,
                   trans='T', lower=False).T)
"""
import json
import os
import platform
import sys

import numpy as np
import scipy
import scipy.linalg as sla

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures",
                   "linalg_numpy.json")
SEED = 20250611
NORMS = {"fro": "fro", "nuc": "nuc", "2": 2, "-2": -2, "1": 1, "-1": -1, "inf": np.inf,
         "-inf": -np.inf}


def orthogonal(rng, n):
    q, r = np.linalg.qr(rng.standard_normal((n, n)))
    return q * np.sign(np.diag(r))


def inputs(rng):
    a = {}
    a["wc4"] = rng.standard_normal((4, 4)) + 3.0 * np.eye(4)
    a["batch3"] = rng.standard_normal((2, 3, 3)) + 2.0 * np.eye(3)
    g = rng.standard_normal((5, 5))
    a["spd5"] = g @ g.T + 5.0 * np.eye(5)
    q = orthogonal(rng, 4)
    sym = (q * np.array([-2.5, -0.7, 1.3, 3.1])) @ q.T
    a["sym4"] = (sym + sym.T) / 2
    junk = rng.standard_normal((4, 4)) * 10
    a["sym4_junk_upper"] = np.tril(a["sym4"]) + np.triu(junk, 1)
    a["sym4_junk_lower"] = np.triu(a["sym4"]) + np.tril(junk, -1)
    a["tall"] = rng.standard_normal((6, 4))
    a["wide"] = rng.standard_normal((3, 5))
    # Small integers: exactly rank 2 in f64 and in f32.
    a["rankdef"] = (rng.integers(-3, 4, (5, 2)) @ rng.integers(-3, 4, (2, 4))).astype(float)
    # Exactly singular, square: its rows 1..5. In f64, LAPACK's elimination of these small
    # integers meets exactly zero pivots (at 2, before the last one, and 3; asserted
    # below). Not so in f32, where the multiplier 2.625 / 3.5 rounds.
    a["sing4"] = a["rankdef"][1:5].copy()
    u, v = orthogonal(rng, 6), orthogonal(rng, 6)
    a["ill6"] = (u * np.logspace(0, -6, 6)) @ v.T
    t = rng.standard_normal((5, 5))
    t[np.diag_indices(5)] = np.sign(np.diag(t)) * (2.0 + np.abs(np.diag(t)))
    a["tri5"] = t
    return a


def results(rng, a):
    r = {}
    sv = lambda x: np.linalg.svd(x, compute_uv=False)  # noqa: E731

    for k, x in a.items():
        if k == "sing4":
            continue  # singular: no condition number; checked exactly
        s = sv(x)
        if k == "rankdef":
            r[f"{k}/kappa"] = s[0] / s[np.linalg.matrix_rank(x) - 1]
        elif k == "tri5":
            tris = [np.tril(x), np.triu(x), np.tril(x, -1) + np.eye(5)]
            r[f"{k}/kappa"] = max(np.linalg.cond(t) for t in tris)
        else:
            r[f"{k}/kappa"] = np.max(s[..., 0] / s[..., -1])

    for k in ["wc4", "batch3", "spd5", "ill6"]:
        x = a[k]
        n = x.shape[-1]
        b = rng.standard_normal(x.shape[:-2] + (n, 3 if k != "ill6" else 2))
        vb = rng.standard_normal(n)
        r[f"{k}/solve_b"], r[f"{k}/solve"] = b, np.linalg.solve(x, b)
        r[f"{k}/solve_vb"], r[f"{k}/solve_v"] = vb, np.linalg.solve(x, vb)
        r[f"{k}/inv"] = np.linalg.inv(x)
        r[f"{k}/det"] = np.linalg.det(x)
        sign, logabs = np.linalg.slogdet(x)
        r[f"{k}/slogdet_sign"], r[f"{k}/slogdet_logabsdet"] = sign, logabs
        for p, name in [(None, "none"), (1, "1"), (np.inf, "inf")]:
            r[f"{k}/cond_{name}"] = np.linalg.cond(x, p)

    r["spd5/cholesky"] = np.linalg.cholesky(a["spd5"])
    for k in ["spd5", "sym4"]:
        w, v = np.linalg.eigh(a[k])
        r[f"{k}/eigvalsh"], r[f"{k}/eigh_v"] = np.linalg.eigvalsh(a[k]), v
        assert np.allclose(w, r[f"{k}/eigvalsh"], rtol=1e-14, atol=0)
    assert np.allclose(np.linalg.eigvalsh(a["sym4_junk_upper"], UPLO="L"), r["sym4/eigvalsh"])
    assert np.allclose(np.linalg.eigvalsh(a["sym4_junk_lower"], UPLO="U"), r["sym4/eigvalsh"])

    for k in ["wc4", "batch3", "spd5", "tall", "wide", "rankdef", "ill6"]:
        x = a[k]
        r[f"{k}/svdvals"] = sv(x)
        r[f"{k}/pinv"] = np.linalg.pinv(x, rtol=None)
        for name, o in NORMS.items():
            r[f"{k}/norm_{name}"] = np.linalg.matrix_norm(x, ord=o)
        if k != "rankdef":
            r[f"{k}/cond_none"] = np.linalg.cond(x)

    for k in ["wc4", "batch3", "tall", "wide", "ill6"]:
        x = a[k]
        u, _, vh = np.linalg.svd(x, full_matrices=False)
        r[f"{k}/svd_u"], r[f"{k}/svd_vh"] = u, vh
        q, rr = np.linalg.qr(x)
        r[f"{k}/qr_q"], r[f"{k}/qr_r"] = q, rr
        p, lo, up = sla.lu(x)
        r[f"{k}/lu_p"], r[f"{k}/lu_l"], r[f"{k}/lu_u"] = p, lo, up

    for k in ["tall", "wide", "rankdef"]:
        x = a[k]
        m = x.shape[0]
        b = rng.standard_normal((m, 2))
        sol, res, rank, s = np.linalg.lstsq(x, b, rcond=None)
        r[f"{k}/lstsq_b"], r[f"{k}/lstsq_x"] = b, sol
        r[f"{k}/lstsq_rank"], r[f"{k}/lstsq_s"] = float(rank), s
        if res.size:
            r[f"{k}/lstsq_res"] = res
        vb = rng.standard_normal(m)
        sol, res, _, _ = np.linalg.lstsq(x, vb, rcond=None)
        r[f"{k}/lstsq_vb"], r[f"{k}/lstsq_vx"] = vb, sol
        if res.size:
            r[f"{k}/lstsq_vres"] = res[0]
    assert r["rankdef/lstsq_rank"] == 2.0
    assert "tall/lstsq_res" in r and "wide/lstsq_res" not in r

    x = a["sing4"]
    r["sing4/det"] = np.linalg.det(x)
    r["sing4/slogdet_sign"], r["sing4/slogdet_logabsdet"] = np.linalg.slogdet(x)
    r["sing4/lu_p"], r["sing4/lu_l"], r["sing4/lu_u"] = sla.lu(x)
    assert r["sing4/det"] == 0.0 and r["sing4/slogdet_logabsdet"] == -np.inf
    assert r["sing4/lu_u"][2, 2] == 0.0 and r["sing4/lu_u"][3, 3] == 0.0

    t = a["tri5"]
    b = rng.standard_normal((5, 3))
    rb = rng.standard_normal((2, 5))
    r["tri5/tri_b"], r["tri5/tri_rb"] = b, rb
    r["tri5/tri_lower"] = sla.solve_triangular(t, b, lower=True)
    r["tri5/tri_upper"] = sla.solve_triangular(t, b, lower=False)
    r["tri5/tri_unit_lower"] = sla.solve_triangular(t, b, lower=True, unit_diagonal=True)
    r["tri5/tri_right_upper"] = sla.solve_triangular(t, rb.T, trans="T", lower=False).T
    assert np.allclose(r["tri5/tri_right_upper"] @ np.triu(t), rb)
    return r


def num(v):
    v = float(v)
    if np.isfinite(v):
        return repr(v)
    return '"nan"' if np.isnan(v) else ('"inf"' if v > 0 else '"-inf"')


def main():
    rng = np.random.default_rng(SEED)
    a = inputs(rng)
    arrays = {**a, **results(rng, a)}
    meta = {
        "generator": "scripts/linalg_fixtures.py",
        "seed": SEED,
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "python": platform.python_version(),
        "lapack": ", ".join(
            f"{k}: {v.get('name', '?')} {v.get('version', '')}".strip()
            for k, v in np.show_config(mode="dicts")["Build Dependencies"].items()),
        "encoding": "row-major float64 as repr; non-finite as the strings inf, -inf, nan",
    }
    lines = ["{", '"meta": ' + json.dumps(meta) + ",", '"arrays": {']
    items = []
    for name, v in arrays.items():
        v = np.asarray(v, dtype=np.float64)
        data = ", ".join(num(x) for x in v.ravel())
        items.append(f'"{name}": {{"shape": {list(v.shape)}, "data": [{data}]}}')
    lines.append(",\n".join(items))
    lines += ["}", "}"]
    text = "\n".join(lines) + "\n"
    json.loads(text)  # valid JSON
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        f.write(text)
    kappas = {k[:-6]: float(v) for k, v in arrays.items() if k.endswith("/kappa")}
    print(f"wrote {os.path.relpath(OUT)}: {len(arrays)} arrays, {len(text)} bytes", file=sys.stderr)
    print("condition numbers: " + ", ".join(f"{k} {v:.3g}" for k, v in kappas.items()),
          file=sys.stderr)
    print("det: " + ", ".join(f"{k} {np.ravel(arrays[k + '/det'])}"
                              for k in ["wc4", "batch3", "spd5", "ill6"]), file=sys.stderr)


if __name__ == "__main__":
    main()
