#!/usr/bin/env python3
"""llama.cpp peer: prefill and decode speed of a GGUF model on the CPU.

What it measures
----------------
The same two numbers ndfuse reports for a GGUF model, measured with
llama.cpp (through its Python binding, llama-cpp-python) on the same machine
and in the same run, so the two can be compared side by side:

* prefill: after ``llm.reset()``, one ``llm.eval(prompt_ids)`` over exactly
  ``--prompt-tokens`` token ids (one batch, n_batch=512).
  tokens/s = prompt tokens / seconds of that call.
* decode: greedy, one token at a time. Each step takes the argmax of the
  logits of the last position (``llama_get_logits_ith(ctx, -1)``) and feeds it
  back with ``llm.eval([tok])`` -- one token through the model per step, no
  speculative or batched tricks. Only the ``eval`` calls are timed (the numpy
  argmax between them is not). tokens/s = decode tokens / summed seconds.
  (In llama-cpp-python 0.3.x with logits_all=False, ``llm.scores`` is no
  longer filled by ``eval``, so the logits are read with
  ``llama_get_logits_ith(ctx, -1)``; see ``argmax_last``.)

Before the timed runs there is one untimed warm-up pass (a short prefill and a
few decode steps) so that mmap page-in and thread start-up are not counted.
Each measurement is repeated ``--repeat`` times; the best (max tok/s) and the
median are reported.

The model is loaded with
``Llama(model_path=..., n_ctx=512, n_threads=N, n_threads_batch=N,
n_batch=512, verbose=False, logits_all=False)``; N defaults to os.cpu_count().
``--prompt-tokens + --decode-tokens`` must fit in n_ctx=512.

Install (CPU only, built from source for the native CPU; no cmake/ninja on
the machine, so they come from PyPI into the venv first):

    python3 -m venv /tmp/llamacpp-venv
    /tmp/llamacpp-venv/bin/pip install cmake ninja
    PATH=/tmp/llamacpp-venv/bin:$PATH CMAKE_ARGS="-DGGML_NATIVE=ON" \\
        CMAKE_BUILD_PARALLEL_LEVEL=2 \\
        /tmp/llamacpp-venv/bin/pip install --no-cache-dir llama-cpp-python==0.3.36

(llama-cpp-python 0.3.36, vendoring ggml 0.25.3; the build compiles
llama.cpp with -march=native and takes several minutes on 2 cores.)

Usage
-----
    /tmp/llamacpp-venv/bin/python scripts/llama_cpp_peer.py MODEL.gguf \\
        [--threads N] [--prompt-tokens 128] [--decode-tokens 128] \\
        [--repeat 3] [--json]

Without ``--json`` it prints one short human line; with ``--json`` one JSON
object:

    {"peer": "llama.cpp", "version": ..., "threads": N, "prompt_tokens": P,
     "decode_tokens": D, "prefill_tok_s": best, "decode_tok_s": best,
     "prefill_tok_s_median": ..., "decode_tok_s_median": ...,
     "model": ..., "system_info": ...}

ndfuse's own figures (``ndfuse generate --json`` and the bench rows) are set
next to these in bench/RESULTS.md; run both with the same thread count, model
file, prompt and decode lengths, on an otherwise idle machine.
"""

import argparse
import json
import os
import statistics
import sys
import time

PARAGRAPH = (
    "The quick brown fox jumps over the lazy dog while the sun sets behind "
    "the hills. In the small village nearby, people gather in the square to "
    "talk about the harvest, the weather, and the news from the city. "
    "Children run between the stalls of the market, and an old man plays a "
    "slow tune on his violin as the lights come on one by one. "
)

N_CTX = 512


def build_prompt(llm, n_tokens):
    """Exactly ``n_tokens`` token ids from a fixed English paragraph."""
    text = PARAGRAPH
    ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
    while len(ids) < n_tokens:
        text += PARAGRAPH
        ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
    return list(ids[:n_tokens])


def argmax_last(llm, np):
    """Greedy pick from the logits of the last evaluated position.

    With logits_all=False, llama-cpp-python 0.3.x's ``Llama.eval`` no longer
    copies logits into ``llm.scores`` (it stays all zeros, so its argmax would
    always be token 0). Read them straight from the context instead:
    ``llama_get_logits_ith(ctx, -1)`` is the last position's row, n_vocab long.
    """
    ptr = llm._ctx.get_logits_ith(-1)
    logits = np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),))
    return int(np.argmax(logits))


def run_once(llm, np, prompt_ids, n_decode):
    """One prefill + greedy decode. Returns (prefill_s, decode_s)."""
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(prompt_ids)
    prefill_s = time.perf_counter() - t0

    decode_s = 0.0
    tok = argmax_last(llm, np)
    for _ in range(n_decode):
        t0 = time.perf_counter()
        llm.eval([tok])
        decode_s += time.perf_counter() - t0
        tok = argmax_last(llm, np)
    return prefill_s, decode_s


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="path to a .gguf model")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)

    if args.prompt_tokens < 1 or args.decode_tokens < 1 or args.repeat < 1:
        ap.error("--prompt-tokens, --decode-tokens and --repeat must be >= 1")
    if args.prompt_tokens + args.decode_tokens > N_CTX:
        ap.error(f"--prompt-tokens + --decode-tokens must be <= n_ctx={N_CTX}")
    if not os.path.isfile(args.model):
        ap.error(f"no such model file: {args.model}")

    try:
        import numpy as np
        import llama_cpp
    except ImportError as e:
        sys.exit(f"llama_cpp_peer: {e}; install llama-cpp-python (see the docstring)")

    llm = llama_cpp.Llama(
        model_path=args.model,
        n_ctx=N_CTX,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        n_batch=512,
        verbose=False,
        logits_all=False,
    )
    prompt_ids = build_prompt(llm, args.prompt_tokens)
    assert len(prompt_ids) == args.prompt_tokens

    # Untimed warm-up: page the weights in, start the thread pool.
    run_once(llm, np, prompt_ids[: min(16, len(prompt_ids))], 4)

    prefill, decode = [], []
    for _ in range(args.repeat):
        p_s, d_s = run_once(llm, np, prompt_ids, args.decode_tokens)
        prefill.append(args.prompt_tokens / p_s)
        decode.append(args.decode_tokens / d_s)

    sysinfo = llama_cpp.llama_print_system_info()
    if isinstance(sysinfo, bytes):
        sysinfo = sysinfo.decode("utf-8", "replace")
    result = {
        "peer": "llama.cpp",
        "version": f"llama-cpp-python {llama_cpp.__version__}",
        "threads": args.threads,
        "prompt_tokens": args.prompt_tokens,
        "decode_tokens": args.decode_tokens,
        "prefill_tok_s": round(max(prefill), 2),
        "decode_tok_s": round(max(decode), 2),
        "prefill_tok_s_median": round(statistics.median(prefill), 2),
        "decode_tok_s_median": round(statistics.median(decode), 2),
        "model": os.path.basename(args.model),
        "system_info": sysinfo.strip(),
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"llama.cpp ({result['version']}) {result['model']} "
            f"threads={args.threads}: prefill {result['prefill_tok_s']:.1f} tok/s "
            f"(median {result['prefill_tok_s_median']:.1f}, P={args.prompt_tokens}), "
            f"decode {result['decode_tok_s']:.1f} tok/s "
            f"(median {result['decode_tok_s_median']:.1f}, D={args.decode_tokens}), "
            f"best of {args.repeat}"
        )


if __name__ == "__main__":
    main()
