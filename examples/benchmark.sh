#!/usr/bin/env bash
# Vanilla vs ngram vs native Medusa vs Clover through vLLM on MT-Bench, quick version (a few
# minutes on 2 idle CPU cores; timings need a quiet machine). Drop --quick for the full
# protocol (batch 1/4/16/64, T=0 and 1); add `--clover NAME=DIR` for more Clover checkpoints.
set -euo pipefail
cd "$(dirname "$0")/.."                                 # the repository (checkpoints/, .venv/)
[ -n "${VIRTUAL_ENV:-}" ] || source .venv/bin/activate  # the project's environment
OUT=${OUT:-${TMPDIR:-/tmp}/vllm-clover-bench-quick}
vllm-clover bench --quick --out "$OUT"                  # progress bar, then the table
ls -l "$OUT"                                            # results.json, results.md
