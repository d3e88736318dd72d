#!/bin/bash
# AVX2 emulated on this Zen 4: oneDNN and ATen capped at AVX2, the plugin's choices read a flag
# list without AVX-512. usage: bash emu.sh TREE OUT [bench args...] (the venv's vllm-clover first on PATH)
tree=$1; out=$2; shift 2
flags=$(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2 | tr ' ' '\n' | grep -v -E '^(avx512|amx)' | tr '\n' ' ')
export ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 CLOVER_CPU_FLAGS="$flags"
PYTHONPATH=$tree vllm-clover bench --methods vanilla clover --temperatures 0 --max-tokens 64 --dtype bfloat16 --repeats 3 --out "$out" "$@"
