#!/usr/bin/env python3
"""Makes the digits fixture of ndfuse-nn (nn/data/digits/): features.npy, labels.npy.

The data is the UCI "Optical Recognition of Handwritten Digits" test set (Alpaydin &
Kaynak, 1998), 1797 8x8 images of integer pixels 0..16, as scikit-learn ships it:
sklearn/datasets/data/digits.csv.gz inside the scikit-learn wheel (64 pixel columns,
then the label). The wheel is fetched with `pip download` and only that one file is
read out of it, so neither scikit-learn nor numpy needs to be installed: the .npy files
are written by hand (format 1.0, little-endian, C order).

    python3 scripts/make_digits.py            # writes nn/data/digits/{features,labels}.npy
    python3 scripts/make_digits.py --wheel W  # uses an already downloaded wheel W

Outputs: features.npy float32 [1797, 64] (raw 0..16 pixel values, no scaling) and
labels.npy int64 [1797]. The script prints their SHA-256 for the README.
"""

import argparse
import glob
import gzip
import hashlib
import os
import struct
import subprocess
import sys
import tempfile
import zipfile

SKLEARN_VERSION = "1.9.1"
MEMBER = "sklearn/datasets/data/digits.csv.gz"
ROWS, PIXELS = 1797, 64


def npy_bytes(descr, shape, payload):
    """A .npy (format 1.0) file's bytes: magic, version, padded header, data."""
    dims = f"{shape[0]}," if len(shape) == 1 else ", ".join(map(str, shape))
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': ({dims}), }}"
    # The header (with its newline) pads the preamble to a multiple of 64 bytes.
    preamble = 10
    pad = (-(preamble + len(header) + 1)) % 64
    header = header + " " * pad + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode("latin1") + payload


def fetch_wheel(directory):
    subprocess.run(
        [sys.executable, "-m", "pip", "download", f"scikit-learn=={SKLEARN_VERSION}",
         "--no-deps", "--only-binary", ":all:", "-d", directory],
        check=True,
    )
    wheels = glob.glob(os.path.join(directory, "scikit_learn-*.whl"))
    if not wheels:
        sys.exit(f"no scikit-learn wheel in {directory}")
    return wheels[0]


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", help="a scikit-learn wheel already downloaded")
    parser.add_argument("--out", default=os.path.join(root, "nn", "data", "digits"))
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        wheel = args.wheel or fetch_wheel(tmp)
        with zipfile.ZipFile(wheel) as z:
            packed = z.read(MEMBER)
    print(f"{MEMBER} sha256 {hashlib.sha256(packed).hexdigest()}")

    pixels, labels = [], []
    for line in gzip.decompress(packed).decode("ascii").splitlines():
        if not line.strip():
            continue
        values = [float(v) for v in line.split(",")]
        if len(values) != PIXELS + 1:
            sys.exit(f"a row of {len(values)} values, expected {PIXELS + 1}")
        if any(v != int(v) or not 0 <= v <= 16 for v in values[:PIXELS]):
            sys.exit("a pixel outside the integers 0..16")
        pixels.extend(values[:PIXELS])
        labels.append(int(values[PIXELS]))
    if len(labels) != ROWS:
        sys.exit(f"{len(labels)} rows, expected {ROWS}")

    os.makedirs(args.out, exist_ok=True)
    outputs = {
        "features.npy": npy_bytes("<f4", (ROWS, PIXELS), struct.pack(f"<{len(pixels)}f", *pixels)),
        "labels.npy": npy_bytes("<i8", (ROWS,), struct.pack(f"<{len(labels)}q", *labels)),
    }
    for name, data in outputs.items():
        path = os.path.join(args.out, name)
        with open(path, "wb") as f:
            f.write(data)
        print(f"{hashlib.sha256(data).hexdigest()}  {name}  ({len(data)} bytes)")


if __name__ == "__main__":
    main()
