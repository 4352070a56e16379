#!/usr/bin/env bash
# The one entry point for GPU tests and benchmarks (DESIGN.md section 9). Run it on the GPU
# machine from the repository root:
#
#     bash scripts/gpu_check.sh                      # everything
#     GPU_STEPS="tests" bash scripts/gpu_check.sh    # a subset: tests, exact, lone, sweep, benches,
#                                                    # model, long, drafts, trace, diag, serve,
#                                                    # serve-bisect, replay, stall, fp8,
#                                                    # fp8-tune, kv8, bisect, attn-decode,
#                                                    # decode-scores, gather-ab,
#                                                    # prefill-ab, moe-layout, fp8-prompt,
#                                                    # timeline, step-kernels, draft-choices,
#                                                    # env-ab, moe-tiles, attn-prefill,
#                                                    # fp8-gluon,
#                                                    # lone-host, draft-overhead, route-layout,
#                                                    # peer-build, peer
#
# tests:   the tests marked `cuda` or `triton` (kernels against references, bitwise
#          exactness of the engine on the GPU, the GPU sampler), then 10,000 full-width rows
#          of the GPU keyed draw against the CPU path (benchmarks/check_gpu_draw.py);
#          CUDA_TESTS names other test paths, PYTEST_K narrows them (a call is 10 minutes),
#          GPU_JOBS processes (default 4, see below);
# exact:   the engine's bitwise tests alone (lone greedy and sampled steps against shared
#          rounds, shared rows against each stream alone, the PLE kernels; 568 s on the H200
#          at e1cf0e1, near a call's 600: run `lone` and the rest apart when short of time);
# lone:    the lone driver's tests only: plain and drafted steps by size, churn, sampled
#          steps, drafted steps through size tables (tests/gpu/test_lone*_gpu.py,
#          tests/kernels/test_drafted_size_tables.py);
# fp8:     the block-FP8 GEMMs against their references and row invariance, the FP8 engine's
#          exactness and the n-gram tables in host memory (tests/kernels/test_triton_*fp8.py,
#          test_row_kind_fp8.py: prompt rows' own tiles; tests/gpu/test_fp8_gpu.py), then `bench model` on flashnext-12l in FP8 at 1 and 16
#          streams (FP8_ARGS overrides);
# fp8-tune: the block-FP8 linear and experts kernels at one decode row, cold weights, each
#          tile's time and bits (benchmarks/tune_fp8_decode.py, about 45 s; FP8_TUNE_ARGS
#          adds its arguments: "--rows 16 --only experts")
# kv8:     the 8-bit KV cache (--kv-cache-dtype fp8): the Triton kernels reading e4m3 and
#          its scales (tests/kernels/test_triton_kv8.py), the engine's exactness with it
#          (tests/gpu/test_kv8_gpu.py), then `bench model` on flashnext-12l with FP8 weights
#          and the 8-bit cache at 1 and 16 streams (KV8_ARGS overrides);
# benches: every benchmarks/bench_*.py that takes `--device`, run with `--device cuda`;
# model:   `flashlane bench model` on a random flashnext-12l against transformers
#          (MODEL_ARGS overrides its arguments);
# long:    issue 29's long contexts: `flashlane bench model` on flashnext-12l decoding at 64,
#          16k, 64k and 128k-token prompts at 1, 4 and 16 streams, and prefill at 2k-32k
#          (LONG_ARGS overrides)
# drafts:  drafts on against off with the embedded model on code prompts at 1, 4, 16 and 64
#          streams, default flags (benchmarks/bench_lanes_cpu.py --device cuda; DRAFT_ARGS
#          overrides)
# trace:   where a batch's time goes round by round, drafts off then on, at TRACE_STREAMS
#          ("16 64"): each round's shared step, lone call and drafted call in wall ms
#          (benchmarks/round_trace.py), with the drafts step, the why of its ratios
# draft-choices: each drafted-call verdict of the depth rule with its prices, levels 1, 4, 16
#          in one engine as the drafts step runs them (benchmarks/draft_choices.py;
#          CHOICE_ARGS overrides)
# lone-host: whether the lone loop waits on the GPU or its host: steps, wall a step, the
#          host's wait for a step's rows and its land, drafts off and on, at 16 and 64
#          streams (benchmarks/lone_host.py; LONE_HOST_ARGS overrides)
# draft-overhead: what drafting on costs where nothing drafts, at 16 and 64 streams: off and
#          on pairs' walls, then the host functions whose own time differs most between
#          a profiled pass of each (benchmarks/draft_overhead.py; DRAFT_OVERHEAD_ARGS overrides)
# route-layout: the MoE's decode front (router product, pick and the pairs' layout in one
#          launch) at 1 / 4 / 16 / 64 rows, 24 layers in a graph, and the layout alone, each
#          layout against the sort's (benchmarks/route_layout.py; seconds; ROUTE_ARGS overrides)
# step-kernels: a lone step's GPU time by kernel, plain against drafted, at 16 streams
#          (benchmarks/step_kernels.py; STEP_KERNEL_ARGS overrides)
# timeline: one decode step's kernels in order at TIMELINE_STREAMS (1) in sessions of
#          TIMELINE_CONTEXT positions (71808, bench model's), and a TIMELINE_PREFILL-token
#          (2048) prefill's kernels and idle gaps (benchmarks/profile_gpu.py) of TIMELINE_CONFIG
#          (flashnext-12l; the real model: flashnext, TIMELINE_CONTEXT=12480); TIMELINE_QUANT=fp8:
#          the linears in block FP8 (files named _fp8)
# diag:    where a decode step's time goes: one lone step's kernels in order with their own
#          time at 1 and 4 streams (benchmarks/profile_gpu.py --timeline), an 8k prefill's
#          kernels and idle gaps (--prefill-timeline), the small decode products with cold
#          weights (benchmarks/cold_linears.py), 24 chained hyper-connection reads
#          (benchmarks/hc_read_chain.py) and the MoE's router, pick and layout by warps
#          (benchmarks/route_warps.py)
# sweep:   issue 26's shape sweep: 20 seeded random small qwen4_exp configs, each served
#          alone, batched with 2 and 15 others, drafted, resumed and moved, replies compared
#          token for token, six configs at once (benchmarks/shape_sweep.py --jobs 6; at
#          a21fedd its configs took 4-70 s each on the H200; one at a time, the first configs'
#          17 models filled a 560 s call at fa9ace7); SWEEP_ARGS overrides its arguments;
#          SWEEP_ARGS="--device cuda --siblings --configs 24 --jobs 6": issue 33's families)
# serve:   `flashlane serve --config flashnext-12l --random-weights` on the GPU (SERVE_MODEL
#          overrides the model flags), measured by `flashlane bench serve` with Poisson
#          arrivals at concurrency 1, 4, 16, 64, replies checked against each alone (SERVE_ARGS
#          overrides). Needs fastapi, starlette, uvicorn, pydantic(-core), annotated-types,
#          typing-inspection, llguidance, anyio, idna, click, h11, annotated-doc,
#          opentelemetry-api and typing-extensions: carry their wheels in .whl/ (the GPU
#          machine has none; without them `flashlane serve` says which one it lacks).
# serve-bisect: the served replies against alone at concurrency 4 with one mechanism off at a
#          time (--no-drafts, --no-lone, --no-graphs, --no-enable-prefix-caching; BISECT_FLAGS
#          and BISECT_ARGS override): which one a reply that differs from alone needs.
# replay:  bench serve's 64 prompts through an engine without the server, alone and in groups
#          (benchmarks/alone_replay.py: which replies differ from alone and where; about 2
#          minutes on the H200 with flashnext-12l; REPLAY_ARGS overrides)
# prefill-ab: bench model's 8k prefill (246 ms at f7dfcdb) against profile_gpu.py's (112 ms)
#          on one engine: the same prompts timed at each stage of bench model's sequence, the
#          collector held and not, inside the profiler; then bench model's own 2k and 8k
#          (benchmarks/prefill_ab.py; PREFILL_AB_ARGS overrides; ~3 minutes)
# fp8-prompt: the FP8 linears and experts at 2k and 8k rows as prompt rows (e4m3 activations
#          on wgmma) and as decode rows, each call's time, its share of the e4m3 matrix rate
#          measured in the run, and how far the two outputs lie apart
#          (benchmarks/fp8_prompt_rows.py; FP8_PROMPT_ARGS overrides; about a minute);
#          FP8_PROMPT_ARGS="--tiles --rows 8192": each product in other prompt tiles too,
#          their times and whether they keep the default tile's bits
# moe-layout: the MoE's expert-sorted layout of a prompt's pairs, the chunked launches against
#          the torch sort they replaced, side by side: tensors equal, GPU and host time a call
#          (benchmarks/moe_layout.py; LAYOUT_ARGS overrides; seconds)
# round-split: issue 28's drafting at one stream: a short prompt's round and a drafted lone
#          call's load (the MTP head's absorb), wall, launches, kernels, host functions
#          and a burst of 8 prompts in one round against one (benchmarks/round_split.py,
#          embedded model; SPLIT_ARGS overrides; ~1 minute)
# prefill-variants: the prefill linears whose partitions run in one program, in wider tiles
#          and each loop over the partitions, bits against the model's tile
#          (benchmarks/prefill_variants.py; VARIANTS_ARGS overrides, default --rows 8192)
# stall:   issue 29's stall: 8 streams of flashnext-12l decoding, a 32k prompt arriving; their
#          gap p99 against without it, its TTFT against alone (benchmarks/long_prompt_stall.py;
#          STALL_ARGS overrides)
# moe-tiles: the experts' grouped launches at 2,048 and 8,192 prompt rows in candidate tiles,
#          each timed and its bits against the default's (benchmarks/moe_prefill_tiles.py;
#          about 2 minutes on the H100)
# attn-prefill: the QSA prompt attention's walk in candidate tiles at a long prompt (16,384
#          rows; ATTN_PREFILL_ARGS="--tokens 32768"), each timed, its rows' bits alone and in
#          windows, its difference from the default's (benchmarks/attention_prefill.py): at
#          8k a tile of 128 x 64 on 8 warps was 8% faster (other bits) on the H200 (0e77c8b)
# fp8-gluon: issue 34's experiment (benchmarks/fp8_gluon.py): the FP8 prompt rows' product in
#          Gluon with each K block's wgmma overlapping the block before's scaling, timed
#          against linear_fp8's prompt tile at the real model's shapes, and its bits against it
# env-ab:  `bench model` (MODEL_ARGS) with default flags, then with AB_ENV set (NAME=VALUE:
#          an experiment's switch, a variable the code reads), side by side in one call
#          (files bench_model_ab_default_* and bench_model_ab_<NAME_VALUE>_*)
# gather-ab: `bench model` on flashnext-12l at 64, 16k and 64k-token prompts, 1 / 4 / 16
#          streams, with the default kernels (the gathered decode attention and the spread
#          select) and with `--kernels walk` (the split walk, one select program a row);
#          GATHER_ARGS overrides, GATHER_KERNELS="walk" runs one half; GATHER_KERNELS=
#          "auto listed": the default against the listed attention (an experiment,
#          kernels/attention/triton_listed.py)
# attn-decode: the QSA attention for decode rows at 16k, 64k and 128k keys, 1 / 4 / 16
#          streams: the indexer, the plain, skipping and split walks and the gathered
#          attention (kernels/attention/triton_gather.py, the default), each against the
#          selected keys' roofline, and the layer as a step runs it (benchmarks/attention_decode.py;
#          ATTN_ARGS overrides: "--capacity 71808" puts the rows in sessions as large as
#          bench model's; "--kv8" adds the 8-bit cache's fold options, triton_listed.FOLD_OPTIONS8)
# decode-scores: the indexer's scores for decode rows at 16k, 64k and 128k keys, 1 / 4 / 16
#          streams, one row and a verify window of three: the prompt rows' tile against each
#          decode tile candidate, the keys' read rate, bits alone against batched, the mask's
#          keys that differ (benchmarks/decode_scores.py; SCORES_ARGS overrides)
# bisect:  which Triton kernel takes a sibling's fp32 logits away from the references, each
#          kernel alone on the references (benchmarks/sibling_kernel_bisect.py; BISECT_NAMES:
#          the families, default qwen3_5_moe qwen3_next)
# peer-build: llama.cpp b11434 for sm_90 from .peer/llama.cpp-b11434.tar.gz (made by
#          scripts/llama_cpp_subset.py; carry .peer) into .peer/src and .peer/build, and at the
#          same time the GGUF of the random flashnext-4l (seed 0) into .peer/gguf/ (28.9 GB; the
#          disk holds 64): one call of under 10 minutes, each half skipped when already done;
#          PEER_CONFIG=qwen3-next-4l, qwen3.5-moe-12l or qwen3.5-12l: a sibling's GGUF through
#          its own llama.cpp arch (qwen3next, qwen35moe, qwen35; 17.7, 23.9 and 9.7 GB);
# peer:    `flashlane bench model --peer llama.cpp` on that build and GGUF (PEER_ARGS overrides
#          its arguments): ours and llama.cpp's decode at 1, 4, 16, 64 streams and prefill, in
#          one JSON. Run both in one call, GPU_STEPS="peer-build peer" (carry .peer and .whl;
#          286 s on the H200): a later call did not find .peer/src and the GGUF again.
# Name the commit sent: FLASHLANE_COMMIT=<short sha> GPU_STEPS=... (see below).
# Wheels in .whl/ (fla-core: the device tool's README says how to fetch them) are installed
# to /tmp/site first. Logs and each benchmark's JSON go to ${OUT:-benchmarks/results}/.
# Exits non-zero if any step failed, after running them all.
set -uo pipefail

out="${OUT:-benchmarks/results}"
steps="${GPU_STEPS:-tests benches model}"
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
# the GPU machine has no install of flashlane: run it from this tree
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
# the commit the results name (flashlane/bench/common.commit): FLASHLANE_COMMIT if given (the
# device's .git may be an older checkout than the tree it was sent), else HEAD, marked
# "+changes" when the tracked files differ from it
if [[ -z "${FLASHLANE_COMMIT:-}" ]] && head="$(git rev-parse --short HEAD 2>/dev/null)"; then
    git diff --quiet HEAD -- 2>/dev/null || head="$head+changes"
    export FLASHLANE_COMMIT="$head"
fi
cuda_tests="${CUDA_TESTS:-tests/kernels tests/gpu tests/sampling}"
# GPU_JOBS: test processes sharing the GPU (pytest-xdist, in the device's image), a file
# each (a module's model is built once): the suite is mostly Triton compiles and Python,
# which one process leaves serial on 16 cores; the sweep's six processes on one GPU kept
# every bit (0 of 1,400 differ). GPU_JOBS=1: serial.
# (pyproject's addopts ask for two processes: -n 0 or, without xdist, no addopts, is serial)
jobs="-o addopts="
if python -c "import xdist" 2>/dev/null; then
    jobs="-n 0"
    [[ "${GPU_JOBS:-4}" -gt 1 ]] && jobs="-n ${GPU_JOBS:-4} --dist loadfile"
fi
stamp="$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$out"
failed=()

if [[ " $steps " == *" tests "* ]]; then
    echo "== python -m pytest -m 'cuda or triton' $jobs $cuda_tests"
    # shellcheck disable=SC2086
    python -m pytest -m "cuda or triton" -v -rf --tb=short -p no:cacheprovider $jobs \
        ${PYTEST_K:+-k "$PYTEST_K"} $cuda_tests 2>&1 \
        | tee "$out/gpu_tests_$stamp.log" || failed+=("pytest")
    echo "== python benchmarks/check_gpu_draw.py"
    python benchmarks/check_gpu_draw.py 2>&1 | tee -a "$out/gpu_tests_$stamp.log" \
        || failed+=("check_gpu_draw")
fi

# gpu_pytest NAME FILES...: the tests marked cuda or triton among FILES (PYTEST_K narrows them:
# `PYTEST_K=drafted GPU_STEPS=lone`, then `PYTEST_K="not drafted"`), logged as gpu_NAME
gpu_pytest() {
    local name="$1"
    shift
    echo "== python -m pytest -m 'cuda or triton' $jobs $*"
    # PYTEST_K: a -k expression, to split a long step over two calls
    # shellcheck disable=SC2086
    python -m pytest -m "cuda or triton" -v -rf --tb=short --durations=30 -p no:cacheprovider \
        $jobs ${PYTEST_K:+-k "$PYTEST_K"} "$@" 2>&1 \
        | tee "$out/gpu_${name}_$stamp.log" || failed+=("$name")
}

if [[ " $steps " == *" exact "* ]]; then
    # the engine's exactness on the GPU first, in one short call: lone steps (greedy and
    # sampled) against shared rounds, shared rows against each stream alone, the PLE kernels
    gpu_pytest exact tests/gpu/test_lone_gpu.py tests/gpu/test_lone_sampled_gpu.py \
        tests/gpu/test_exact_gpu.py tests/kernels/test_triton_ple.py
fi

if [[ " $steps " == *" lone "* ]]; then
    gpu_pytest lone tests/gpu/test_lone_gpu.py tests/gpu/test_lone_sampled_gpu.py \
        tests/kernels/test_drafted_size_tables.py
fi

if [[ " $steps " == *" fp8 "* ]]; then
    gpu_pytest fp8 tests/kernels/test_triton_fp8.py tests/kernels/test_triton_moe_fp8.py \
        tests/kernels/test_row_kind_fp8.py tests/gpu/test_fp8_gpu.py
    args="${FP8_ARGS:---config flashnext-12l --random-weights --quantization fp8 --streams 1,16}"
    echo "== flashlane bench model $args"
    python -m flashlane.cli bench model $args --json "$out/bench_model_fp8_$stamp.json" 2>&1 \
        | tee "$out/bench_model_fp8_$stamp.log" || failed+=("bench model fp8")
fi

if [[ " $steps " == *" fp8-tune "* ]]; then
    echo "== python benchmarks/tune_fp8_decode.py ${FP8_TUNE_ARGS:-}"
    # shellcheck disable=SC2086
    python benchmarks/tune_fp8_decode.py ${FP8_TUNE_ARGS:-} 2>&1 \
        | tee "$out/tune_fp8_decode${FP8_TUNE_ARGS:+_args}_$stamp.log" \
        | grep -v '^{"bench"' || failed+=("tune_fp8_decode")
fi

if [[ " $steps " == *" kv8 "* ]]; then
    gpu_pytest kv8 tests/kernels/test_triton_kv8.py tests/gpu/test_kv8_gpu.py
    args="${KV8_ARGS:---config flashnext-12l --random-weights --quantization fp8 --kv-cache-dtype fp8 --streams 1,16}"
    echo "== flashlane bench model $args"
    python -m flashlane.cli bench model $args --json "$out/bench_model_kv8_$stamp.json" 2>&1 \
        | tee "$out/bench_model_kv8_$stamp.log" || failed+=("bench model kv8")
fi

if [[ " $steps " == *" sweep "* ]]; then
    echo "== python benchmarks/shape_sweep.py ${SWEEP_ARGS:---device cuda --jobs 6}"
    # shellcheck disable=SC2086
    python benchmarks/shape_sweep.py ${SWEEP_ARGS:---device cuda --jobs 6} \
        --json "$out/shape_sweep_$stamp.json" 2>&1 | tee "$out/shape_sweep_$stamp.log" \
        || failed+=("sweep")
fi

if [[ " $steps " == *" benches "* ]]; then
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
fi

if [[ " $steps " == *" model "* ]]; then
    args="${MODEL_ARGS:---config flashnext-12l --random-weights --peer transformers}"
    echo "== flashlane bench model $args"
    python -m flashlane.cli bench model $args --json "$out/bench_model_$stamp.json" 2>&1 \
        | tee "$out/bench_model_$stamp.log" || failed+=("bench model")
fi

if [[ " $steps " == *" long "* ]]; then
    args="${LONG_ARGS:---config flashnext-12l --random-weights --streams 1,4,16 --prompt-len 64,16384,65536,131072 --prefill 2048,8192,16384,32768}"
    echo "== flashlane bench model $args"
    python -m flashlane.cli bench model $args --json "$out/bench_model_long_$stamp.json" 2>&1 \
        | tee "$out/bench_model_long_$stamp.log" || failed+=("bench model long")
fi

if [[ " $steps " == *" gather-ab "* ]]; then
    # the long-context decode paths end to end: default kernels, then --kernels walk
    args="${GATHER_ARGS:---config flashnext-12l --random-weights --streams 1,4,16 --prompt-len 64,16384,65536 --prefill 2048}"
    for kernels in ${GATHER_KERNELS:-auto walk}; do
        echo "== flashlane bench model $args --kernels $kernels"
        python -m flashlane.cli bench model $args --kernels "$kernels" \
            --json "$out/bench_model_gather_ab_${kernels}_$stamp.json" 2>&1 \
            | tee "$out/bench_model_gather_ab_${kernels}_$stamp.log" || failed+=("gather-ab $kernels")
    done
fi

if [[ " $steps " == *" env-ab "* ]]; then
    args="${MODEL_ARGS:---config flashnext-12l --random-weights --streams 1,4,16}"
    for side in default "${AB_ENV:?env-ab needs AB_ENV=NAME=VALUE}"; do
        tag="${side//[^A-Za-z0-9]/_}"
        with=()
        [[ $side != default ]] && with=("$side")
        echo "== ${with[*]:-(default)} flashlane bench model $args"
        # shellcheck disable=SC2086
        env "${with[@]}" python -m flashlane.cli bench model $args \
            --json "$out/bench_model_ab_${tag}_$stamp.json" 2>&1 \
            | tee "$out/bench_model_ab_${tag}_$stamp.log" || failed+=("env-ab $side")
    done
fi

if [[ " $steps " == *" drafts "* ]]; then
    args="${DRAFT_ARGS:---concurrency 1,4,16,64 --tokens 64 --repeats 3}"
    log="$out/bench_lanes_cuda_$stamp.log"
    echo "== python benchmarks/bench_lanes_cpu.py --device cuda $args"
    if python benchmarks/bench_lanes_cpu.py --device cuda $args 2>&1 | tee "$log"; then
        tail -n 1 "$log" > "$out/bench_lanes_cuda_$stamp.json"
    else
        failed+=("drafts")
    fi
fi

if [[ " $steps " == *" timeline "* ]]; then
    # one decode step's kernels at TIMELINE_STREAMS in sessions of TIMELINE_CONTEXT positions
    # (bench model's 71,808 by default: a 64-token row in a large session), and a
    # TIMELINE_PREFILL-token prefill's kernels and idle gaps
    n="${TIMELINE_STREAMS:-1}"
    ctx="${TIMELINE_CONTEXT:-71808}"
    len="${TIMELINE_PREFILL:-2048}"
    cfg="${TIMELINE_CONFIG:-flashnext-12l}"
    quant=()
    tag=""
    [[ -n "${TIMELINE_QUANT:-}" ]] && quant=(--quantization "$TIMELINE_QUANT") && tag="_$TIMELINE_QUANT"
    echo "== python benchmarks/profile_gpu.py --config $cfg --streams $n --context $ctx ${quant[*]}"
    FLASHLANE_LONE_STREAMS=$n python benchmarks/profile_gpu.py --config "$cfg" \
        --streams "$n" --prefill "$len" --rows 30 --context "$ctx" "${quant[@]}" \
        --timeline "$out/timeline_${cfg}${tag}_${n}streams_${ctx}_$stamp.txt" \
        --prefill-timeline "$out/timeline_prefill_${len}_${cfg}${tag}_$stamp.txt" \
        > "$out/profile_${cfg}${tag}_${n}streams_${ctx}_$stamp.txt" 2>&1 \
        || failed+=("profile timeline")
    tail -n 40 "$out/profile_${cfg}${tag}_${n}streams_${ctx}_$stamp.txt"
fi

if [[ " $steps " == *" route-layout "* ]]; then
    echo "== python benchmarks/route_layout.py ${ROUTE_ARGS:-}"
    # shellcheck disable=SC2086
    python benchmarks/route_layout.py ${ROUTE_ARGS:-} 2>&1 | tee "$out/route_layout_$stamp.log" \
        | grep -v '^{"bench"' || failed+=("route_layout")
fi

if [[ " $steps " == *" diag "* ]]; then
    for n in 1 4; do
        echo "== python benchmarks/profile_gpu.py --config flashnext-12l --streams $n --timeline"
        FLASHLANE_LONE_STREAMS=$n python benchmarks/profile_gpu.py --config flashnext-12l \
            --streams "$n" --prefill 128 --rows 30 \
            --timeline "$out/timeline_flashnext-12l_${n}streams_$stamp.txt" \
            > "$out/profile_flashnext-12l_${n}streams_$stamp.txt" 2>&1 || failed+=("profile $n")
        tail -n 1 "$out/profile_flashnext-12l_${n}streams_$stamp.txt"
    done
    echo "== python benchmarks/profile_gpu.py --config flashnext-12l --prefill 8192 --prefill-timeline"
    python benchmarks/profile_gpu.py --config flashnext-12l --streams 1 --prefill 8192 --rows 2 \
        --prefill-timeline "$out/timeline_prefill_8k_flashnext-12l_$stamp.txt" \
        > "$out/profile_prefill_8k_flashnext-12l_$stamp.txt" 2>&1 || failed+=("profile prefill")
    echo "== python benchmarks/cold_linears.py ${COLD_ARGS:-}"
    # shellcheck disable=SC2086
    python benchmarks/cold_linears.py ${COLD_ARGS:-} 2>&1 | tee "$out/cold_linears_$stamp.log" \
        || failed+=("cold_linears")
    echo "== python benchmarks/hc_read_chain.py"
    python benchmarks/hc_read_chain.py 2>&1 | tee "$out/hc_read_chain_$stamp.log" \
        || failed+=("hc_read_chain")
    echo "== python benchmarks/route_warps.py"
    python benchmarks/route_warps.py 2>&1 | tee "$out/route_warps_$stamp.log" \
        || failed+=("route_warps")
fi

# serve_and_bench TAG ENGINE_FLAGS BENCH_ARGS: flashlane serve on port 8123 with
# SERVE_MODEL and ENGINE_FLAGS, measured by bench serve (its JSON and logs named by TAG)
serve_and_bench() {
    local tag="$1" flags="$2" args="$3" server
    local serve_model="${SERVE_MODEL:---config flashnext-12l --random-weights}"
    echo "== flashlane serve $serve_model $flags --device cuda; flashlane bench serve $args"
    # shellcheck disable=SC2086
    python -m flashlane.cli serve $serve_model $flags --device cuda --port 8123 \
        > "$out/serve_cuda_$tag.log" 2>&1 &
    server=$!
    for _ in $(seq 480); do
        python -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8123/health')" \
            2> /dev/null && break
        kill -0 "$server" 2> /dev/null || break  # it exited: its log says why
        sleep 0.5
    done
    kill -0 "$server" 2> /dev/null || { tail -n 5 "$out/serve_cuda_$tag.log"; failed+=("serve"); }
    # shellcheck disable=SC2086
    python -m flashlane.cli bench serve --url http://127.0.0.1:8123 $args \
        --output-json "$out/bench_serve_cuda_$tag.json" 2>&1 \
        | tee "$out/bench_serve_cuda_$tag.log" || failed+=("bench serve $tag")
    # kernels the warm rounds left uncompiled (server/stats_log.py), each a slow round
    grep -h "compiled while serving" "$out/serve_cuda_$tag.log" | cut -c1-300 | head -n 20 || true
    # captures that failed: the server stepped eagerly, not the product (1a68afd)
    if grep -h "failed, steps run eagerly" "$out/serve_cuda_$tag.log"; then
        failed+=("serve $tag: eager lone steps")
    fi
    kill "$server"
    wait "$server"
}

if [[ " $steps " == *" serve "* ]]; then
    # issue 28's served run: flashnext-12l built in memory behind the server, default flags,
    # Poisson arrivals at each concurrency, every reply compared with it alone (by its ids)
    serve_and_bench "$stamp" "" "${SERVE_ARGS:---concurrency 1,4,16,64 --num-prompts 64 --input-len 128 --output-len 128 --request-rate 32 --check-alone}"
fi

if [[ " $steps " == *" serve-bisect "* ]]; then
    # which mechanism a served reply that differs from alone needs: the same prompts at
    # concurrency 4, with one mechanism off at a time (BISECT_FLAGS, ;-separated)
    args="${BISECT_ARGS:---concurrency 4 --num-prompts 64 --input-len 128 --output-len 128 --request-rate 32 --check-alone}"
    IFS=';' read -ra variants <<< "${BISECT_FLAGS:---no-drafts;--no-lone;--no-graphs;--no-enable-prefix-caching}"
    for flags in "${variants[@]}"; do
        serve_and_bench "bisect${flags// /}_$stamp" "$flags" "$args"
    done
    grep -h "differs from alone\|^ *4 " "$out"/bench_serve_cuda_bisect*_"$stamp".log
fi

# script_step STEP NAME ARGS: python benchmarks/NAME.py ARGS, logged as NAME, its last line
# (one JSON line) kept as NAME's JSON
script_step() {
    echo "== python benchmarks/$2.py $3"
    # shellcheck disable=SC2086
    python "benchmarks/$2.py" $3 2>&1 | tee "$out/$2_$stamp.log" || failed+=("$1")
    tail -n 1 "$out/$2_$stamp.log" > "$out/$2_$stamp.json"
}

if [[ " $steps " == *" moe-tiles "* ]]; then
    script_step moe-tiles moe_prefill_tiles ""
fi

if [[ " $steps " == *" attn-prefill "* ]]; then
    script_step attn-prefill attention_prefill "${ATTN_PREFILL_ARGS:---tokens 16384}"
fi

if [[ " $steps " == *" fp8-gluon "* ]]; then
    script_step fp8-gluon fp8_gluon "${FP8_GLUON_ARGS:---rows 8192}"
fi

if [[ " $steps " == *" replay "* ]]; then
    script_step replay alone_replay "${REPLAY_ARGS:---device cuda --config flashnext-12l}"
fi

if [[ " $steps " == *" draft-overhead "* ]]; then
    script_step draft-overhead draft_overhead "${DRAFT_OVERHEAD_ARGS:---device cuda --streams 16,64 --pairs 9}"
fi

if [[ " $steps " == *" trace "* ]]; then
    for n in ${TRACE_STREAMS:-16 64}; do
        echo "== python benchmarks/round_trace.py --device cuda --streams $n"
        python benchmarks/round_trace.py --device cuda --streams "$n" 2>&1 \
            | tee "$out/round_trace_${n}_$stamp.log" || failed+=("trace $n")
        tail -n 1 "$out/round_trace_${n}_$stamp.log" > "$out/round_trace_${n}_$stamp.json"
    done
fi

if [[ " $steps " == *" draft-choices "* ]]; then
    script_step draft-choices draft_choices "${CHOICE_ARGS:---device cuda --streams 1,4,16}"
fi

if [[ " $steps " == *" lone-host "* ]]; then
    script_step lone-host lone_host "${LONE_HOST_ARGS:---device cuda --streams 16,64}"
fi

if [[ " $steps " == *" step-kernels "* ]]; then
    script_step step-kernels step_kernels "${STEP_KERNEL_ARGS:---device cuda --streams 16}"
fi

if [[ " $steps " == *" round-split "* ]]; then
    script_step round-split round_split "${SPLIT_ARGS:---device cuda}"
fi

if [[ " $steps " == *" fp8-prompt "* ]]; then
    script_step fp8-prompt fp8_prompt_rows "${FP8_PROMPT_ARGS:---rows 2048,8192}"
fi

if [[ " $steps " == *" moe-layout "* ]]; then
    script_step moe-layout moe_layout "${LAYOUT_ARGS:---rows 2048,8192}"
fi

if [[ " $steps " == *" prefill-variants "* ]]; then
    script_step prefill-variants prefill_variants "${VARIANTS_ARGS:---rows 8192}"
fi

if [[ " $steps " == *" stall "* ]]; then
    script_step stall long_prompt_stall "${STALL_ARGS:---config flashnext-12l --device cuda \
--streams 8 --prompt-len 32768 --decode-tokens 256}"
fi

if [[ " $steps " == *" prefill-ab "* ]]; then
    echo "== python benchmarks/prefill_ab.py ${PREFILL_AB_ARGS:-}"
    # shellcheck disable=SC2086
    python benchmarks/prefill_ab.py ${PREFILL_AB_ARGS:-} 2>&1 | tee "$out/prefill_ab_$stamp.log" \
        || failed+=("prefill-ab")
    # and bench model's own figure, in the same call (PDL off changed nothing at 8k: 4a3fe7c)
    echo "== flashlane bench model --config flashnext-12l --random-weights --streams 16 --prefill 2048,8192"
    python -m flashlane bench model --config flashnext-12l --random-weights --streams 16 \
        --prefill 2048,8192 --json "$out/bench_model_prefill_ab_$stamp.json" 2>&1 \
        | tee "$out/bench_model_prefill_ab_$stamp.log" || failed+=("prefill-ab bench model")
fi

if [[ " $steps " == *" decode-scores "* ]]; then
    script_step decode-scores decode_scores "${SCORES_ARGS:-}"
fi

if [[ " $steps " == *" attn-decode "* ]]; then
    script_step attn-decode attention_decode "${ATTN_ARGS:-}"
fi

if [[ " $steps " == *" bisect "* ]]; then
    echo "== python benchmarks/sibling_kernel_bisect.py ${BISECT_NAMES:-qwen3_5_moe qwen3_next}"
    # shellcheck disable=SC2086
    python benchmarks/sibling_kernel_bisect.py ${BISECT_NAMES:-qwen3_5_moe qwen3_next} 2>&1 \
        | grep -v "Writing model" | tee "$out/sibling_kernel_bisect_$stamp.log" \
        || failed+=("bisect")
fi

# PEER_CONFIG, PEER_DEVICE (cpu: a CPU build, a CPU-made GGUF) and PEER_BUILD let the steps run
# on a small config elsewhere; the GGUF's name is the one bench model --peer llama.cpp looks for
peer_dir="${PEER_DIR:-.peer}"
peer_build="${PEER_BUILD:-$peer_dir/build}"
peer_config="${PEER_CONFIG:-flashnext-4l}"
peer_device="${PEER_DEVICE:-cuda}"
peer_name="$peer_config"
[[ "$peer_config" == *.json ]] && peer_name="$(basename "$(dirname "$peer_config")")"
peer_gguf="$peer_dir/gguf/$peer_name-seed0-bf16.gguf"

if [[ " $steps " == *" peer-build "* ]]; then
    log="$out/peer_build_$stamp.log"
    echo "== peer-build: llama.cpp into $peer_build, the GGUF into $peer_gguf (log: $log)"
    {
        echo "[$(date -u +%T)] disk before:"; df -h . | tail -n 1
        if [[ ! -f "$peer_dir/src/CMakeLists.txt" ]]; then
            rm -rf "$peer_dir/src" "$peer_dir/llama.cpp" \
                && tar -xzf "$peer_dir/llama.cpp-b11434.tar.gz" -C "$peer_dir" \
                && mv "$peer_dir/llama.cpp" "$peer_dir/src" \
                && echo "[$(date -u +%T)] extracted $peer_dir/src"
        fi
    } 2>&1 | tee "$log"
    # the build takes the cores, the GGUF the GPU and a few cores: side by side they fit a call
    cuda_flag=""
    [[ "$peer_device" == cuda* ]] && cuda_flag="--cuda"
    python -m flashlane.llama_cpp.build --src "$peer_dir/src" --build "$peer_build" $cuda_flag \
        --jobs "$(nproc)" > "$out/peer_build_cmake_$stamp.log" 2>&1 &
    build_pid=$!
    python -m flashlane.llama_cpp.write_gguf --config "$peer_config" --seed 0 \
        --device "$peer_device" \
        --out "$peer_gguf" --llama-src "$peer_dir/src" --threads 4 \
        > "$out/peer_gguf_$stamp.log" 2>&1 &
    gguf_pid=$!
    beat=0
    while kill -0 "$build_pid" 2> /dev/null || kill -0 "$gguf_pid" 2> /dev/null; do
        sleep 2
        ((++beat % 15)) && continue  # a progress line every 30 s
        echo "[$(date -u +%T)] build $(grep -o '^\[[0-9]*/[0-9]*\]' \
            "$out/peer_build_cmake_$stamp.log" | tail -n 1); $(grep '^\[' \
            "$out/peer_gguf_$stamp.log" | tail -n 1)" | tee -a "$log"
    done
    wait "$build_pid" || failed+=("peer-build (llama.cpp; see $out/peer_build_cmake_$stamp.log)")
    wait "$gguf_pid" || failed+=("peer-build (gguf; see $out/peer_gguf_$stamp.log)")
    tail -n 2 "$out/peer_build_cmake_$stamp.log" "$out/peer_gguf_$stamp.log" | tee -a "$log"
    { echo "[$(date -u +%T)] disk after:"; df -h . | tail -n 1; du -sh "$peer_dir"/*; } \
        2>&1 | tee -a "$log"
fi

if [[ " $steps " == *" peer "* ]]; then
    args="${PEER_ARGS:---config $peer_config --random-weights --peer llama.cpp --streams 1,4,16,64 --prefill 2048,16384}"
    echo "== flashlane bench model $args --llama-cpp $peer_build --gguf-dir $peer_dir/gguf"
    python -m flashlane.cli bench model $args --llama-cpp "$peer_build" \
        --gguf-dir "$peer_dir/gguf" --json "$out/bench_model_peer_$stamp.json" 2>&1 \
        | tee "$out/bench_model_peer_$stamp.log" || failed+=("bench model --peer llama.cpp")
fi

if ((${#failed[@]})); then
    echo "gpu_check: FAILED: ${failed[*]}"
    exit 1
fi
echo "gpu_check: all passed; results in $out/"
