#!/usr/bin/env python3
"""The PyTorch twin of `cargo run --release -p ndfuse-nn --example train_gpt`.

The same corpus (Debian's `fortunes`, plain files directly under
/usr/share/games/fortunes in sorted name order, never `off/`), vocabulary, 90/10
split and training/validation windows (drawn from the same SplitMix64 hashes as
nn/src/text.rs, so both see the very same batches); the same model (4 blocks, 4
heads, d_model 128, context 128, GELU MLP, learned positions, tied head, GPT-2
initialisation) and recipe (batch 32, AdamW lr 1e-3 betas (0.9, 0.99) weight decay
0.1 on tensors of rank >= 2 only, warm-up over the first 5% of the steps then cosine
decay to 1e-4, gradient norm clipped to 1). Prints the validation loss in bits per
character. Initial weights differ (another generator), so expect the curves to agree
to a few hundredths of a bit, not exactly.

Run by hand, not in CI:  python3 scripts/train_gpt_torch.py [--steps 2000] [--compile]
Needs torch (CPU is enough: pip install torch).
"""

import argparse
import math
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH, CONTEXT = 32, 128
TRAIN_SEED, VALIDATION_SEED = 1, 2
MASK = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15


def hash64(x):
    """SplitMix64's output for state x (nn/src/data.rs: hash64)."""
    z = (x + GAMMA) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def read_fortunes(folder):
    names = []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        if name.endswith(".dat") or name.endswith(".u8"):
            continue
        names.append(path)
    if not names:
        raise SystemExit(f"{folder}: no fortune collection (apt-get install fortunes)")
    text = "".join(open(p, "rb").read().decode("utf-8", errors="replace") for p in names)
    vocab = sorted(set(text))
    index = {c: i for i, c in enumerate(vocab)}
    ids = [index[c] for c in text]
    held = int(len(ids) * 0.1)
    return vocab, ids[: len(ids) - held], ids[len(ids) - held :], len(names)


def batch(ids, seed, step):
    """CharCorpus::batch: rows of CONTEXT + 1 ids at hashed starts."""
    n, length = len(ids), CONTEXT + 1
    count = n - length + 1
    base = hash64(seed ^ hash64(step))
    rows = []
    for row in range(BATCH):
        r = hash64(base ^ hash64(row))
        s = (r * count) >> 64
        rows.append(ids[s : s + length])
    w = torch.tensor(rows, dtype=torch.long)
    return w[:, :-1], w[:, 1:]


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d, eps=1e-5), nn.LayerNorm(d, eps=1e-5)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, c = x.shape
        h = self.ln1(x)
        split = lambda y: y.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        a = F.scaled_dot_product_attention(
            split(self.q(h)), split(self.k(h)), split(self.v(h)), is_causal=True
        )
        x = x + self.o(a.transpose(1, 2).reshape(b, t, c))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Gpt(nn.Module):
    def __init__(self, vocab, d=128, layers=4, heads=4):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(CONTEXT, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d, eps=1e-5)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif "ln" in name:
                nn.init.ones_(p)
            elif name.endswith(".o.weight") or name.endswith("fc2.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers))
            else:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, ids):
        x = self.tok(ids) + self.pos.weight[: ids.shape[1]]
        for b in self.blocks:
            x = b(x)
        return self.ln_f(x) @ self.tok.weight.T  # tied head


def rate(step, steps):
    """Schedule::Cosine { base 1e-3, floor 1e-4 }.with_warmup(steps / 20)."""
    warmup = max(steps // 20, 1)
    if step < warmup:
        return 1e-3 * (step + 1) / warmup
    t, length = step - warmup, max(steps - warmup, 1)
    if t >= length:
        return 1e-4
    return 1e-4 + (1e-3 - 1e-4) * 0.5 * (1 + math.cos(math.pi * t / length))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--eval-every", type=int, default=0)
    ap.add_argument("--eval-batches", type=int, default=16)
    ap.add_argument("--data", default="/usr/share/games/fortunes")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's choice)")
    ap.add_argument("--compile", action="store_true", help="train through torch.compile(model)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    vocab, train, val, files = read_fortunes(args.data)
    print(f"fortunes: {files} files, {len(train) + len(val)} characters, vocabulary {len(vocab)}")
    model = Gpt(len(vocab))
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=1e-3, betas=(0.9, 0.99), eps=1e-8,
    )
    step_model = torch.compile(model) if args.compile else model
    every = args.eval_every or max(args.steps // 8, 1)
    val_batches = [batch(val, VALIDATION_SEED, i) for i in range(args.eval_batches)]

    def validation_bits():
        model.eval()
        with torch.no_grad():
            total = sum(
                F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item() for x, y in val_batches
            )
        model.train()
        return total / len(val_batches) / math.log(2)

    print(f"step 0: validation {validation_bits():.3f} bits/char")
    start, recent = time.time(), []
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = rate(step, args.steps)
        x, y = batch(train, TRAIN_SEED, step)
        loss = F.cross_entropy(step_model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        recent.append(loss.item() / math.log(2))
        done = step + 1
        if done == 1:
            after_first = time.time()  # the first step compiles under --compile
        if done % every == 0 or done == args.steps:
            print(
                f"step {done}: train {sum(recent) / len(recent):.3f} bits/char "
                f"(mean of the last {len(recent)} steps), validation {validation_bits():.3f}, "
                f"{time.time() - start:.1f} s"
            )
            recent = []
    secs = time.time() - start
    rest = (time.time() - after_first) / max(args.steps - 1, 1)
    print(
        f"trained {args.steps} steps in {secs:.1f} s ({rest:.3f} s/step after the first, "
        f"which took {after_first - start:.1f} s); "
        f"final validation {validation_bits():.3f} bits/char"
    )


if __name__ == "__main__":
    main()
