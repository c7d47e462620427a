#!/usr/bin/env bash
# Fetch what the ONNX importer's tests run, from PyPI packages, into DIR:
#
#   DIR/node/<test>/{model.onnx,test_data_set_*/…}   the ONNX backend test suite's node
#                                                    tests, from onnx==1.19.1 (the last
#                                                    wheel that ships them)
#   DIR/silero-vad/silero_vad_16k_sequence.onnx      from silero-vad==6.2.3 (MIT)
#   DIR/rapidocr/*.onnx                               from rapidocr-onnxruntime==1.4.4
#                                                    (Apache-2.0)
#
#   bash scripts/fetch_onnx.sh DIR
#
# CI (.ci/run) runs it into a cache directory outside the clone and exports it as
# NDFUSE_ONNX; the tests find the files there. It does nothing when DIR/.complete
# exists. Needs python3 with pip (zipfile unpacks the wheels).
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 DIR" >&2
  exit 2
fi
DIR="$1"
if [ -f "$DIR/.complete" ]; then
  exit 0
fi
mkdir -p "$DIR"
TMP="$(mktemp -d "${TMPDIR:-/tmp}/ndfuse-onnx.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
python3 -m pip download --quiet --disable-pip-version-check --no-deps \
  --dest "$TMP" "onnx==1.19.1" "silero-vad==6.2.3" "rapidocr-onnxruntime==1.4.4"
python3 - "$TMP" "$DIR" <<'PY'
import glob, os, shutil, sys, zipfile

tmp, out = sys.argv[1], sys.argv[2]


def wheel(prefix):
    found = glob.glob(os.path.join(tmp, prefix + "-*.whl"))
    if len(found) != 1:
        sys.exit("expected one %s wheel in %s, found %r" % (prefix, tmp, found))
    return zipfile.ZipFile(found[0])


def extract(z, name, dst):
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    with z.open(name) as src, open(dst + ".part", "wb") as f:
        shutil.copyfileobj(src, f)
    os.replace(dst + ".part", dst)


prefix = "onnx/backend/test/data/node/"
with wheel("onnx") as z:
    names = [n for n in z.namelist() if n.startswith(prefix) and not n.endswith("/")]
    if not names:
        sys.exit("the onnx wheel has no node tests")
    for n in names:
        extract(z, n, os.path.join(out, "node", n[len(prefix):]))

with wheel("silero_vad") as z:
    hits = [n for n in z.namelist() if n.endswith("/silero_vad_16k_sequence.onnx")]
    if len(hits) != 1:
        sys.exit("silero-vad: expected one silero_vad_16k_sequence.onnx, found %r" % hits)
    extract(z, hits[0], os.path.join(out, "silero-vad", "silero_vad_16k_sequence.onnx"))

with wheel("rapidocr_onnxruntime") as z:
    hits = [n for n in z.namelist() if n.endswith(".onnx")]
    if not hits:
        sys.exit("rapidocr-onnxruntime: no .onnx models in the wheel")
    for n in hits:
        extract(z, n, os.path.join(out, "rapidocr", os.path.basename(n)))
PY
touch "$DIR/.complete"
echo "fetched into $DIR: $(ls "$DIR/node" | wc -l) node tests, $(ls "$DIR/rapidocr")"
