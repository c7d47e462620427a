#!/usr/bin/env python3
"""Reference outputs of the two pretrained models that scripts/fetch_models.sh unpacks, as
JSON fixtures for the Rust model-loading tests.

    bash scripts/fetch_models.sh /tmp/ndfuse-models
    python3 -m venv /tmp/fixtures-venv
    /tmp/fixtures-venv/bin/python -m pip install --disable-pip-version-check \
        torch==2.15.0 transformers==5.24.0 gguf==0.19.0 sentence-transformers==6.2.0 \
        tokenizers==0.23.3 numpy==2.4.6 accelerate==1.15.0
    /tmp/fixtures-venv/bin/python scripts/model_fixtures.py /tmp/ndfuse-models models/tests/fixtures

Those are the versions the committed fixtures were made with (each file records them again
under "made_with"); torch is PyPI's default Linux wheel, run on the CPU only. transformers
needs accelerate to load a GGUF file. Everything runs offline from DIR: nothing is fetched
from a model hub.

Writes OUT_DIR/minilm.json and OUT_DIR/smollm2.json:

minilm.json, all-MiniLM-L6-v2 (DIR/all-minilm-l6-v2):
    sentences      six fixed sentences
    ids            their token ids from tokenizer.json (tokenizers.Tokenizer, padding off:
                   the file itself pads to 128), [CLS] ... [SEP]
    embeddings     sentence-transformers' encode(normalize_embeddings=True): mean pooling
                   over the attention mask, then L2 normalisation; 384 floats each
    hidden_first   the last hidden state of sentence 0 at token 0 ([CLS]), first 8 values
    Floats have 7 significant digits.

smollm2.json, SmolLM2-135M-Instruct.Q4_1.gguf (DIR/smollm2) through transformers' GGUF
loader, which dequantises every tensor to f32 and undoes llama.cpp's q/k row permutation:
    gguf_metadata  GGUFReader's key/values (big arrays by length only), tensor_types for
                   blk.0.* and the tensors outside the blocks, tensor_shapes (GGUF's ne
                   order: fastest-varying dimension first), tensor_type_counts
    tokenizer      ids of eight strings, encode(add_special_tokens=False); where llama.cpp's
                   "smollm" pre-tokenizer (digits split off first) would give other ids,
                   they are under "ids_llamacpp_pre" too
    add_bos, bos_id, eos_id
    chat           the chat template applied to one user message, with its ids
    greedy         32 greedy steps for three prompts: the ids fed, the ids generated (no
                   stop at EOS: first_eos_step says where one came), their text, and the
                   top-1 minus top-2 logit margin of each step (from a manual loop over the
                   KV cache, checked to give generate()'s tokens)
    first_logits   the logits after the first greedy prompt: top 10, mean and (population)
                   standard deviation over the vocabulary
It also dumps the tokenizer transformers builds from the GGUF to /tmp/smollm2_tokenizer.json
(tokenizer.json form), for reading.
"""
import json
import os
import re
import sys
from collections import Counter
from importlib.metadata import version

import numpy as np
import torch

SENTENCES = [
    "The cat sat on the mat.",
    "Hello world!",
    "A quick brown fox jumps over the lazy dog near the riverbank.",
    "Is the Café open on Sunday? I'd love a crème brûlée, said Zoë.",
    "In 2024, the team trained 3 models on 1,500 GPUs for 42 days.",
    "Machine learning compilers lower high-level tensor programs into efficient kernels by "
    "fusing elementwise operations, tiling loops for the cache hierarchy, and choosing memory "
    "layouts, which lets a small model run quickly on an ordinary laptop without a graphics card.",
]

TOKENIZER_STRINGS = [
    "The quick brown fox jumps over the lazy dog.",
    "  leading and trailing spaces  ",
    "a  b   c    1",
    "line one\nline two\n\nline four\n",
    "12345 67",
    "café, naïve, 中文, emoji 🙂🚀",
    'fn main() { println!("hi"); }',
    "<|im_start|>user\nHi<|im_end|>",
]

GREEDY_TEXT_PROMPTS = ["The capital of France is", "def fibonacci(n):"]
CHAT_MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
STEPS = 32

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def sig7(x):
    return float(f"{float(x):.7g}")


def versions():
    made = {"python": sys.version.split()[0]}
    for pkg in ["torch", "transformers", "tokenizers", "gguf", "sentence-transformers",
                "numpy", "accelerate"]:
        try:
            made[pkg] = version(pkg)
        except Exception:  # noqa: BLE001 - a missing optional package is recorded as such
            made[pkg] = None
    return made


def minilm(model_dir):
    from tokenizers import Tokenizer
    from transformers import AutoModel

    tk = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    tk.no_padding()
    ids = [tk.encode(s).ids for s in SENTENCES]

    # Mean pooling over the attention mask + L2 normalisation by hand, as a cross-check
    # (and the fallback if sentence-transformers cannot load the folder).
    model = AutoModel.from_pretrained(model_dir).eval()
    manual, hidden_first = [], None
    with torch.no_grad():
        for i, row in enumerate(ids):
            x = torch.tensor([row])
            h = model(input_ids=x, attention_mask=torch.ones_like(x)).last_hidden_state[0]
            if i == 0:
                hidden_first = [sig7(v) for v in h[0, :8]]
            e = h.mean(0)
            manual.append((e / e.norm()).numpy())
    manual = np.stack(manual)

    source = "sentence-transformers SentenceTransformer.encode(normalize_embeddings=True)"
    try:
        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(model_dir, device="cpu")
        st_ids = [st.tokenize([s])["input_ids"][0].tolist() for s in SENTENCES]
        assert st_ids == ids, ("sentence-transformers tokenises differently", st_ids, ids)
        emb = st.encode(SENTENCES, normalize_embeddings=True, convert_to_numpy=True)
    except Exception as err:  # noqa: BLE001
        print("sentence-transformers failed, using the manual pooling:", err)
        source = "transformers AutoModel, mean pooling over attention_mask, L2 normalised"
        emb = manual
    diff = float(np.abs(emb - manual).max())
    print(f"minilm: max |sentence-transformers - manual pooling| = {diff:.2e}")
    assert diff < 1e-4, diff
    norms = np.linalg.norm(emb, axis=1)
    assert np.allclose(norms, 1.0, atol=1e-5), norms

    made = versions()
    made["embeddings_from"] = source
    made["max_abs_diff_vs_manual_mean_pooling"] = float(f"{diff:.3g}")
    return {
        "made_with": made,
        "sentences": SENTENCES,
        "ids": ids,
        "embeddings": [[sig7(v) for v in row] for row in emb],
        "hidden_first": hidden_first,
    }


def gguf_info(path):
    from gguf import GGUFReader, GGUFValueType

    r = GGUFReader(path)
    meta = {}
    for key, field in r.fields.items():
        if key.startswith("GGUF."):
            continue
        if field.types and field.types[0] == GGUFValueType.ARRAY:
            n = len(field.data)
            if n > 16:
                meta[key] = {"array_len": n}
                continue
        value = field.contents()
        if key == "tokenizer.chat_template":
            meta[key] = {"present": True, "chars": len(value)}
            continue
        if isinstance(value, float):
            value = sig7(value)
        meta[key] = value
    meta.setdefault("tokenizer.chat_template", {"present": False})
    meta["gguf_version"] = r.fields["GGUF.version"].contents()

    kept = [t for t in r.tensors if t.name.startswith("blk.0.") or not t.name.startswith("blk.")]
    types = {t.name: t.tensor_type.name for t in kept}
    shapes = {t.name: [int(d) for d in t.shape] for t in kept}
    counts = dict(Counter(t.tensor_type.name for t in r.tensors))
    names = {t.name for t in r.tensors}
    return r, {
        "metadata": meta,
        "tensor_types": types,
        "tensor_shapes": shapes,
        "tensor_type_counts": counts,
        "tensor_count": len(r.tensors),
        "has_output_weight": "output.weight" in names,
    }


def check_qk_permutation(reader, model, n_head, n_kv):
    """transformers' GGUF loader (LlamaTensorProcessor._reverse_permute_weights) maps GGUF
    row h*D + 2*j + i of attn_q / attn_k to HF row h*D + i*(D/2) + j (D = head_dim,
    i in {0, 1}, j < D/2), per head h (q: n_head heads, k: n_kv heads). Check it here."""
    from gguf import dequantize

    out = {}
    for gname, hname, heads in [("blk.0.attn_q.weight", "q_proj", n_head),
                                ("blk.0.attn_k.weight", "k_proj", n_kv)]:
        t = next(t for t in reader.tensors if t.name == gname)
        g = dequantize(t.data, t.tensor_type)  # numpy (rows = out features, cols = in)
        hf = getattr(model.model.layers[0].self_attn, hname).weight.detach().numpy()
        rows, d = g.shape[0], g.shape[0] // heads
        perm = np.empty(rows, dtype=np.int64)  # hf row -> gguf row
        for h in range(heads):
            for i in range(2):
                for j in range(d // 2):
                    perm[h * d + i * (d // 2) + j] = h * d + 2 * j + i
        assert np.array_equal(hf, g[perm]), gname
        assert not np.array_equal(hf, g), gname
        out[hname] = {"heads": heads, "head_dim": d, "checked": True}
    return out


def smollm2(model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from tokenizers import Regex, pre_tokenizers

    gguf_path = os.path.join(model_dir, GGUF_NAME)
    reader, info = gguf_info(gguf_path)
    print("gguf metadata:")
    for k, v in info["metadata"].items():
        print(f"  {k} = {v!r}")
    print("tensor types:", info["tensor_type_counts"])
    for k in info["tensor_types"]:
        print(f"  {k}: {info['tensor_types'][k]} {info['tensor_shapes'][k]}")

    tok = AutoTokenizer.from_pretrained(model_dir, gguf_file=GGUF_NAME)
    with open("/tmp/smollm2_tokenizer.json", "w") as f:
        f.write(tok.backend_tokenizer.to_str(pretty=True))
    backend = json.loads(tok.backend_tokenizer.to_str())

    # llama.cpp's "smollm" pre-tokenizer splits every digit off first (regex \p{N}), then
    # applies GPT-2's regex to what is left; transformers' GGUF loader keeps GPT-2's
    # ByteLevel regex alone. Build the former to flag the strings where the two differ.
    llamacpp = tok.backend_tokenizer.__class__.from_str(tok.backend_tokenizer.to_str())
    llamacpp.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tokenizer_cases = []
    for s in TOKENIZER_STRINGS:
        ids = tok.encode(s, add_special_tokens=False)
        case = {"text": s, "ids": ids}
        alt = llamacpp.encode(s, add_special_tokens=False).ids
        if alt != ids:
            case["ids_llamacpp_pre"] = alt
        assert tok.decode(ids) == s, (s, tok.decode(ids))
        tokenizer_cases.append(case)

    add_bos = tok("x").input_ids != tok.encode("x", add_special_tokens=False)

    chat_text = tok.apply_chat_template(CHAT_MESSAGES, tokenize=False, add_generation_prompt=True)
    chat_ids = tok(chat_text, add_special_tokens=False).input_ids
    templated = tok.apply_chat_template(CHAT_MESSAGES, tokenize=True, add_generation_prompt=True)
    if not isinstance(templated, list):
        templated = templated["input_ids"]
    assert list(templated) == chat_ids, (templated, chat_ids)

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, gguf_file=GGUF_NAME, dtype=torch.float32).eval()
    cfg = model.config
    assert next(model.parameters()).dtype == torch.float32
    tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    qk = check_qk_permutation(reader, model, cfg.num_attention_heads, cfg.num_key_value_heads)

    eos = tok.eos_token_id
    prompts = [(p, tok(p).input_ids) for p in GREEDY_TEXT_PROMPTS] + [(chat_text, chat_ids)]
    greedy, first_logits = [], None
    with torch.no_grad():
        for n, (text, ids) in enumerate(prompts):
            x = torch.tensor([ids])
            gen = model.generate(
                x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=STEPS,
                eos_token_id=None, pad_token_id=eos, temperature=None, top_p=None, top_k=None,
            )[0, len(ids):].tolist()

            tokens, margins = [], []
            out = model(input_ids=x, use_cache=True)
            for _ in range(STEPS):
                logits = out.logits[0, -1]
                if n == 0 and not tokens:
                    top = torch.topk(logits, 10)
                    lf = logits.double()
                    first_logits = {
                        "top": [[int(i), sig7(v)] for v, i in zip(top.values, top.indices)],
                        "mean": sig7(lf.mean()),
                        "std": sig7(lf.std(unbiased=False)),
                    }
                top2 = torch.topk(logits, 2)
                nxt = int(top2.indices[0])
                tokens.append(nxt)
                margins.append(round(float(top2.values[0] - top2.values[1]), 4))
                out = model(input_ids=torch.tensor([[nxt]]), past_key_values=out.past_key_values,
                            use_cache=True)
            assert tokens == gen, (text, tokens, gen)
            first_eos = tokens.index(eos) if eos in tokens else None
            greedy.append({
                "prompt": text,
                "prompt_ids": ids,
                "tokens": tokens,
                "text": tok.decode(tokens, skip_special_tokens=False),
                "first_eos_step": first_eos,
                "margins": margins,
            })
            print(f"greedy {n}: min margin {min(margins):.4f} at step "
                  f"{margins.index(min(margins))}, first EOS {first_eos}: "
                  f"{greedy[-1]['text']!r}")

    made = versions()
    made["model_dtype"] = "float32 (transformers dequantises the GGUF)"
    hf_config = {k: getattr(cfg, k, None) for k in [
        "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
        "max_position_embeddings", "vocab_size", "tie_word_embeddings", "hidden_act"]}
    rope = getattr(cfg, "rope_parameters", None) or {}
    hf_config["rope_theta"] = rope.get("rope_theta", getattr(cfg, "rope_theta", None))
    hf_config["rope_type"] = rope.get("rope_type")
    hf_config["lm_head_tied_to_embed_tokens"] = tied
    return {
        "made_with": made,
        "gguf_metadata": info["metadata"],
        "tensor_types": info["tensor_types"],
        "tensor_shapes": info["tensor_shapes"],
        "tensor_type_counts": info["tensor_type_counts"],
        "tensor_count": info["tensor_count"],
        "has_output_weight": info["has_output_weight"],
        "hf_config": hf_config,
        "qk_permutation": {
            "rule": "HF row h*D + i*(D/2) + j = GGUF row h*D + 2*j + i, i in {0,1}, j < D/2",
            **qk,
        },
        "hf_tokenizer": {k: backend[k] for k in
                         ["normalizer", "pre_tokenizer", "decoder", "post_processor"]},
        "tokenizer": tokenizer_cases,
        "add_bos": add_bos,
        "bos_id": tok.bos_token_id,
        "eos_id": tok.eos_token_id,
        "chat": {"messages": CHAT_MESSAGES, "text": chat_text, "ids": chat_ids},
        "greedy": greedy,
        "first_logits": first_logits,
    }


def write(path, obj):
    text = json.dumps(obj, ensure_ascii=False, indent=1)
    # One line per innermost list of numbers, so the file stays short yet readable.
    text = re.sub(r"\[[-0-9.,eE\s]*\]", lambda m: re.sub(r"\s+", "", m.group(0)), text)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text + "\n")
    size = os.path.getsize(path)
    print(f"wrote {path} ({size} bytes)")
    assert size < 200_000, size


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    model_dir, out_dir = sys.argv[1], sys.argv[2]
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    os.makedirs(out_dir, exist_ok=True)
    write(os.path.join(out_dir, "minilm.json"), minilm(os.path.join(model_dir, "all-minilm-l6-v2")))
    write(os.path.join(out_dir, "smollm2.json"), smollm2(os.path.join(model_dir, "smollm2")))


if __name__ == "__main__":
    main()
