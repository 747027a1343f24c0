#!/usr/bin/env bash
# Wheels for the GPU device (Python 3.12, x86_64; it has torch, transformers and diffusers but not the media
# stack), at exactly the versions of this checkout's .venv. The device runs of 2026-12-08 carried newer ones
# (pyee 16, av 19, cryptography 51 against 13 / 18 / 50 here) and no WebRTC session connected there; the cause
# was not established, and the same versions as here rule that difference out.
#   bash benchmarks/device_wheels.sh [DIR]      # default .whl (ignored by git); then carry it
set -euo pipefail
DIR=${1:-.whl}
PACKAGES="aiortc av aioice pyee cryptography pyopenssl pylibsrtp google-crc32c dnspython ifaddr cffi pycparser
webrtcvad-wheels opuslib-next"
mkdir -p "$DIR"
for name in $PACKAGES; do
  version=$(.venv/bin/python -m pip show "$name" 2>/dev/null | sed -n 's/^Version: //p')
  [ -n "$version" ] || { echo "not in .venv: $name" >&2; continue; }
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_26_x86_64 --platform manylinux_2_34_x86_64 -d "$DIR" "$name==$version"
done
ls "$DIR"
