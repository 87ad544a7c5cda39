#!/usr/bin/env bash
# One prepared GPU check: Wan2.1 1.3B-size random components, a few chained 480p segments
# per available attention backend, seconds per segment and the GPU memory table, and the
# node's `nvidia-smi topo -m` (under 8 minutes on one H200); then the latent families at real
# size (factory/generate/gpu_check_latent.py, under 7 minutes). Record the figures in
# docs/benchmarks.md. `--tiny` runs both on the CPU.
#   bash scripts/gpu_check.sh [--tiny] [--steps N] [--segments N] [--out FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# The node's real topology, for tests/data/topology (see its README): kept next to --out
# (or in $OUT on the device machine), and read back through the parser.
if command -v nvidia-smi >/dev/null && [[ " $* " != *" --tiny "* ]]; then
  keep=${OUT:-.}
  nvidia-smi topo -m > "$keep/topo-m.txt" || true
  nvidia-smi -L > "$keep/nvidia-smi-L.txt" || true
  "$PYTHON" -m factory gpu topology --probe --place 1 || true
fi
timeout 480 "$PYTHON" -m factory.generate.gpu_check "$@"
# Helios-Distilled 14B and AnyFlow-FAR 1.3B at real size (random weights built in memory):
# factory frames/s against one bare pipeline call, memory, seams at the joins.
latent_args=()
for arg in "$@"; do [[ "$arg" == "--tiny" ]] && latent_args+=(--tiny); done
exec timeout 420 "$PYTHON" -m factory.generate.gpu_check_latent "${latent_args[@]}" \
  --out "${OUT:-.}/gpu_check_latent.json"
