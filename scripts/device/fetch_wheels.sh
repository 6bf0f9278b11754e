#!/bin/bash
# Downloads into .whl (or $1) the wheels of the serve stack that the GPU machine's Python 3.12 image lacks (KINDS.md's
# package list): the HTTP front (FastAPI, Starlette, uvicorn, pydantic), the engine core's transport (pyzmq,
# msgspec), Prometheus metrics, structured outputs (xgrammar with apache-tvm-ffi), the LoRA tests' oracle (peft),
# pytest-timeout, and py-spy for the start-up profile. Each wheel alone (--no-deps: the image has the rest), one
# version of each, for CPython 3.12 on manylinux x86_64. Run it here, where pip reaches the package index; then
# carry the folder (about 13 MB) and install it with scripts/device/wheels.sh's carried_wheels in one pip call.
#   bash scripts/device/fetch_wheels.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${1:-.whl}
PACKAGES=(fastapi starlette uvicorn h11 pydantic pydantic-core annotated-types annotated-doc typing-inspection
          typing-extensions prometheus-client pyzmq msgspec "xgrammar>=0.2.9,<0.3" apache-tvm-ffi opentelemetry-api
          pytest-timeout peft py-spy)
PLATFORMS=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_26_x86_64 manylinux_2_24_x86_64 \
         manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64; do
  PLATFORMS+=(--platform "$p")
done
mkdir -p "$DIR"
for package in "${PACKAGES[@]}"; do  # one at a time: pip resolves each alone, as --no-deps means
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]}" -d "$DIR" "$package" 2> >(grep -v "^WARNING: Location" >&2)
done
ls "$DIR"/*.whl | wc -l | xargs echo "wheels in $DIR:"
