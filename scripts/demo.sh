#!/usr/bin/env bash
# Installs what is missing, builds the GPT example (Release, into $BUILD_DIR) and trains it
# data-parallel on 4 ranks. Extra arguments go to train_gpt, e.g.
#   scripts/demo.sh --set train.steps=100 --set zero.bucket_mb=4
#   TORCH=wheel scripts/demo.sh       against LibTorch 2.11 from PyPI (scripts/common.sh)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/common.sh

ensure_dependencies
configure_and_build -- --target train_gpt   # tests and benchmarks are built by scripts/test.sh
prefer_cpu_openblas_kernels
exec mpirun -np 4 --oversubscribe --bind-to none "$BUILD_DIR/examples/train_gpt" \
  --config configs/dp.toml "$@"
