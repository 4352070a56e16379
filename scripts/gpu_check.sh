#!/usr/bin/env bash
# The one entry point for GPU tests and benchmarks (DESIGN.md section 9). Run it on the GPU
# machine from the repository root:
#
#     bash scripts/gpu_check.sh
#
# 1. the tests marked `cuda`;
# 2. every benchmarks/bench_*.py that takes `--device`, run with `--device cuda`.
# Logs and each benchmark's final JSON line go to ${OUT:-benchmarks/results}/. Exits non-zero
# if any step failed, after running them all.
set -uo pipefail

out="${OUT:-benchmarks/results}"
# the GPU machine has no install of flashlane: run it from this tree
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# only the folders that hold cuda tests (others import server packages the GPU image lacks)
cuda_tests="${CUDA_TESTS:-tests/sampling}"
stamp="$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$out"
failed=()

echo "== python -m pytest -m cuda -q $cuda_tests"
python -m pytest -m cuda -q -p no:cacheprovider $cuda_tests 2>&1 | tee "$out/gpu_tests_$stamp.log" || failed+=("pytest -m cuda")

for bench in benchmarks/bench_*.py; do
    grep -q -- "--device" "$bench" || continue  # a CPU-only benchmark
    name="$(basename "$bench" .py)"
    log="$out/${name}_cuda_$stamp.log"
    echo "== python $bench --device cuda"
    if python "$bench" --device cuda 2>&1 | tee "$log"; then
        tail -n 1 "$log" >> "$out/${name}_cuda.jsonl"  # the benchmark's one JSON line
    else
        failed+=("$bench")
    fi
done

if ((${#failed[@]})); then
    echo "gpu_check: FAILED: ${failed[*]}"
    exit 1
fi
echo "gpu_check: all passed; results in $out/"
