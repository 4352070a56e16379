"""memory: session and workspace bytes, the ceiling, --parallel auto, and the options predicate."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flashlane.models.census import state_bytes_per_stream
from flashlane.models.config import ModelConfig
from flashlane.planning.info import describe
from flashlane.planning.memory import (
    GIB,
    LIMIT_ENV,
    MAX_AUTO_SESSIONS,
    OptionConflict,
    OverMemoryLimit,
    activation_bytes,
    check_options,
    parse_limit_gb,
    plan,
    read_ram_bytes,
    resolve_limit_bytes,
    scratch_buffers,
    session_buffers,
    session_bytes,
)
from tests import DATA

REAL = DATA / "flashnext_real_config.json"
TINY = ModelConfig.from_hf({
    "model_type": "qwen4_exp_text", "vocab_size": 512, "hidden_size": 64,
    "num_hidden_layers": 4, "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
    "linear_value_head_dim": 16, "num_experts": 8, "num_experts_per_tok": 2,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "hc_lowrank": 8,
    "ple_layer_ids": [2], "ple_embed_dim": 64, "heads_per_ngram": 2,
    "ngram_vocab_size_base": 1000, "indexer_n_heads": 2, "indexer_head_dim": 16,
    "indexer_budget": 8, "indexer_compress_ratio": 4, "max_position_embeddings": 512,
    "eos_token_id": 1, "rope_parameters": {"rope_theta": 1e7, "partial_rotary_factor": 0.25},
})  # fmt: skip


def test_real_session_bytes_by_hand(real: ModelConfig) -> None:
    cap = 262_144
    attention = 2 * cap * 2 * 256 * 2 + cap * 128 * 2 + cap // 4 * 128 * 2  # K, V, keys, blocks
    gdn = 3 * 10240 * 2 + 48 * 128 * 128 * 4  # conv window, fp32 state
    ple = 9 * 4 * 2560 * 2 + 2 * 8
    assert session_bytes(real, cap, 2, 4) == 13 * attention + 36 * gdn + ple
    assert session_bytes(real, cap, 2, 4, mtp=False) == 12 * attention + 36 * gdn + ple
    assert session_bytes(real, 0, 2, 4) == state_bytes_per_stream(real, 2, 4)
    # --kv-cache-dtype fp8: K, V and keys 1 byte, fp32 scales (2 heads of K and V, a key),
    # the block keys as they were
    eight = 2 * cap * 2 * 256 + cap * 128 + cap // 4 * 128 * 2 + (2 * 2 + 1) * cap * 4
    assert session_bytes(real, cap, 2, 4, kv_fp8=True) == 13 * eight + 36 * gdn + ple


def test_session_bytes_grow_with_capacity_per_block() -> None:
    per_block = session_bytes(TINY, 8, 8, 8) - session_bytes(TINY, 4, 8, 8)
    assert session_bytes(TINY, 4003, 8, 8) - session_bytes(TINY, 4000, 8, 8) < per_block
    assert session_bytes(TINY, 4004, 8, 8) - session_bytes(TINY, 4000, 8, 8) == per_block
    names = [b.name for b in session_buffers(TINY, 64, 2, 4, mtp=False)]
    assert not any(n.startswith("mtp.") for n in names)


def test_session_bytes_equal_the_allocated_state() -> None:
    torch = pytest.importorskip("torch")
    state_mod = pytest.importorskip("flashlane.models.state")
    dtypes = ((torch.float64, torch.float64), (torch.bfloat16, torch.float32))
    for cap, (cache, st) in zip((100, 64), dtypes):
        s = state_mod.SessionState.empty(TINY, cap, cache, st, device="meta")
        cb, sb = cache.itemsize, st.itemsize
        assert s.nbytes() == session_bytes(TINY, cap, cb, sb)
        shapes = sorted(tuple(t.shape) for t in s.tensors())
        ours = sorted(b.shape for b in session_buffers(TINY, cap, cb, sb) for _ in range(b.count))
        assert shapes == ours
        eight = state_mod.SessionState.empty(TINY, cap, cache, st, device="meta", kv_fp8=True)
        assert eight.nbytes() == session_bytes(TINY, cap, cb, sb, kv_fp8=True)
        names = {b.name.split(".")[1] for b in session_buffers(TINY, cap, cb, sb, kv_fp8=True)}
        assert {"k_scale", "v_scale", "index_scale"} <= names


def _limit(cfg: ModelConfig, weights: int, sessions: float, rows: int = 16) -> int:
    """A limit that leaves room for `sessions` full-window CPU sessions after the rest."""
    scratch = sum(b.nbytes for b in scratch_buffers(cfg, rows, 8, 8))
    one = session_bytes(cfg, cfg.max_position_embeddings, 8, 8)
    return weights + scratch + activation_bytes(cfg, rows, "cpu") + int(sessions * one)


def test_prompt_pieces_are_planned() -> None:
    """A round's longest prompt piece adds its rows' activations to the workspace: a plan with
    8,192-row pieces holds 8,192 x prompt_row_bytes more than one without, and a real Flash
    Next row is estimated at a few hundred KB (the GPU run: ~2 GB at 8,192 rows)."""
    from flashlane.planning.buffers import prompt_row_bytes

    limit = _limit(TINY, 10**6, 3.5) + 2 * GIB
    a = plan(TINY, device="cpu", limit_bytes=limit, weight_bytes=10**6, max_rows=16)
    b = plan(
        TINY, device="cpu", limit_bytes=limit, weight_bytes=10**6, max_rows=16, prompt_rows=8192
    )
    assert b.prompt_rows == 8192 and a.prompt_rows == 0
    assert b.activation_bytes - a.activation_bytes == 8192 * prompt_row_bytes(TINY, "cpu", 512)
    real = ModelConfig.from_hf(json.loads(REAL.read_text()))
    assert 200_000 < prompt_row_bytes(real, "cuda", 8192) < 1_000_000


def test_prompt_pieces_shrink_before_sessions_are_refused() -> None:
    """plan_fitting: where 4 sessions do not fit beside 1,024-row pieces, the pieces halve
    (down to MIN_PREFILL_ROWS) until they do; below the floor the error names the pieces."""
    from flashlane.planning.buffers import MIN_PREFILL_ROWS, prompt_row_bytes
    from flashlane.planning.memory import plan_fitting

    row = prompt_row_bytes(TINY, "cpu", 512)
    kw = dict(device="cpu", weight_bytes=10**6, max_rows=16, parallel=4, context=512)
    # room for 4 sessions with 300-row pieces (not 512): 256 rows are planned
    limit = _limit(TINY, 10**6, 4) + 300 * row
    p = plan_fitting(TINY, limit_bytes=limit, prompt_rows=1024, **kw)
    assert p.prompt_rows == 256 == MIN_PREFILL_ROWS["cpu"] and p.num_sessions == 4
    with pytest.raises(OverMemoryLimit):
        plan(TINY, limit_bytes=limit, prompt_rows=512, **kw)
    assert (
        plan_fitting(TINY, limit_bytes=limit + 1024 * row, prompt_rows=1024, **kw).prompt_rows
        == 1024
    )
    with pytest.raises(OverMemoryLimit, match="prompt pieces of 256 rows"):
        plan_fitting(TINY, limit_bytes=limit - 100 * row, prompt_rows=1024, **kw)


def test_auto_sessions_take_shorter_pieces_and_the_cache_yields() -> None:
    """Sessions auto: pieces halve while that adds sessions (below AUTO_SESSIONS_WANTED);
    the default prompt cache takes at most a quarter of what the weights, the workspace and
    the sessions that fit (up to AUTO_SESSIONS_WANTED) leave, so it never costs one of them;
    a given one all it asks."""
    from flashlane.planning.buffers import activation_bytes, prompt_row_bytes
    from flashlane.planning.memory import AUTO_SESSIONS_WANTED, plan_fitting

    row = prompt_row_bytes(TINY, "cpu", 512)
    kw = dict(device="cpu", weight_bytes=10**6, max_rows=16, context=512)
    # room for 2 sessions beside 1,024-row pieces, more beside shorter ones
    limit = _limit(TINY, 10**6, 2.5) + 1024 * row
    assert plan(TINY, limit_bytes=limit, prompt_rows=1024, **kw).num_sessions == 2
    p = plan_fitting(TINY, limit_bytes=limit, prompt_rows=1024, **kw)
    assert p.num_sessions > 2 and p.prompt_rows < 1024
    assert p.num_sessions == AUTO_SESSIONS_WANTED  # as many as auto wants, once pieces are short
    # sessions asked for: the longest pieces that hold them
    asked = plan_fitting(TINY, limit_bytes=limit, prompt_rows=1024, parallel=2, **kw)
    assert asked.prompt_rows == 1024 and asked.num_sessions == 2
    # the cache: a quarter of the room at most when auto, all of it when given
    cache = 10**9
    fixed = 10**6 + sum(b.nbytes for b in scratch_buffers(TINY, 16, 8, 8))
    one = session_bytes(TINY, 512, 8, 8)
    room = limit - fixed - activation_bytes(TINY, 16, "cpu", 1024, 512)
    assert room // one == 2
    auto = plan(TINY, limit_bytes=limit, prompt_rows=1024, prompt_cache_bytes=cache,
                prompt_cache_auto=True, **kw)  # fmt: skip
    assert auto.prompt_cache_bytes == (room - 2 * one) // 4 and auto.num_sessions == 2
    with pytest.raises(OverMemoryLimit, match="prompt cache"):
        plan(TINY, limit_bytes=limit, prompt_rows=1024, prompt_cache_bytes=cache, **kw)


def test_real_flash_next_in_fp8_on_an_h200(real: ModelConfig) -> None:
    """The published config in block FP8 on an H200 at the default ceiling (139.8 GiB less
    5), its n-gram tables in host memory, 64 verify rows: sessions of 32k fit with 2,048-row
    pieces (4 with a 16-bit cache, 7 with the 8-bit one; 2 with 8,192-row pieces), the
    prompt cache yielding to them; 16 in 8 bits with 16 rows and no prompt cache. Rows no
    more than the sessions fill (--max-rows unset), windows narrowed from 9 rows a session
    while that makes room for more: 9 sessions of 32k with a 16-bit cache (10 before each
    counted its row of the keyed draws' buffers, 2.25 MB), 16 with the 8-bit one (issue 34's
    plan: --kv-cache-dtype auto's with FP8 weights), a row each; one of 262,144 beside its 9
    rows (none beside 64)."""
    from flashlane.models.census import count_params
    from flashlane.models.fp8 import QuantSpec
    from flashlane.models.weight_bytes import fp8_bytes
    from flashlane.planning.info_plan import H200_BYTES
    from flashlane.planning.memory import plan_fitting, resolve_prompt_cache_bytes

    limit = resolve_limit_bytes(None, {}, "cuda", H200_BYTES)
    assert round(limit / GIB, 2) == 134.80
    weights = fp8_bytes(real, QuantSpec()).total_bytes - 2 * count_params(real).ngram_table
    cache = resolve_prompt_cache_bytes(None, "cuda", limit)
    kw = dict(device="cuda", limit_bytes=limit, weight_bytes=weights, context=32768)

    def sessions(kv_fp8: bool, rows: int = 64, cache: int = cache) -> tuple[int, int]:
        p = plan_fitting(real, **kw, max_rows=rows, prompt_rows=8192, kv_fp8=kv_fp8,
                         prompt_cache_bytes=cache, prompt_cache_auto=True)  # fmt: skip
        return p.num_sessions, p.prompt_rows

    assert sessions(False) == (4, 2048) and sessions(True) == (7, 2048)
    assert plan(real, **kw, max_rows=64, prompt_rows=8192, prompt_cache_bytes=cache,
                prompt_cache_auto=True).num_sessions == 2  # fmt: skip
    assert sessions(True, rows=16, cache=0)[0] == 16
    for kv_fp8, want in ((False, 9), (True, 16)):
        sized = plan_fitting(real, **kw, max_rows=64, window_rows=9, prompt_rows=8192,
                             prompt_cache_bytes=cache, prompt_cache_auto=True,
                             kv_fp8=kv_fp8)  # fmt: skip
        assert (sized.num_sessions, sized.max_rows) == (want, want) and sized.auto
    kw["context"] = 262_144
    with pytest.raises(OverMemoryLimit):
        plan_fitting(real, **kw, max_rows=64, prompt_rows=8192, prompt_cache_bytes=cache,
                     prompt_cache_auto=True)  # fmt: skip
    whole = plan_fitting(real, **kw, max_rows=64, window_rows=9, prompt_rows=8192,
                         prompt_cache_bytes=cache, prompt_cache_auto=True)  # fmt: skip
    assert (whole.num_sessions, whole.max_rows, whole.serial) == (1, 9, True)


def test_rows_no_more_than_the_sessions_fill() -> None:
    """window_rows (--max-rows unset): sessions asked take rows for their widest windows up
    to max_rows; auto, the most sessions that fit beside their own rows."""
    kw = dict(device="cpu", weight_bytes=10**6, context=512)
    big = _limit(TINY, 10**6, 40, rows=64)
    assert plan(TINY, limit_bytes=big, max_rows=64, window_rows=9, parallel=2, **kw).max_rows == 18
    assert plan(TINY, limit_bytes=big, max_rows=16, window_rows=9, parallel=2, **kw).max_rows == 16
    assert plan(TINY, limit_bytes=big, max_rows=64, parallel=2, **kw).max_rows == 64
    auto = plan(TINY, limit_bytes=big, max_rows=64, window_rows=9, **kw)
    assert auto.max_rows == 64 and auto.num_sessions == MAX_AUTO_SESSIONS  # rows all filled
    # room for 3 sessions beside 64 rows; beside their own rows more fit, one more does not
    small = _limit(TINY, 10**6, 3.5, rows=64)
    fixed = plan(TINY, limit_bytes=small, max_rows=64, **kw)
    sized = plan(TINY, limit_bytes=small, max_rows=64, window_rows=9, **kw)
    n = sized.num_sessions
    assert fixed.num_sessions == 3 < n and sized.auto and sized.max_rows == 9 * n < 64
    with pytest.raises(OverMemoryLimit):
        plan(TINY, limit_bytes=small, max_rows=9 * (n + 1), parallel=n + 1, **kw)


def test_sessions_come_before_drafting_rows() -> None:
    """Auto sessions fewer than AUTO_SESSIONS_WANTED beside windows of 9 rows: windows
    narrow (9, 5, 3, 2, 1 rows a session) while that fits more, up to MAX_AUTO_SESSIONS on
    the CPU; where 16 fit beside wide windows, the windows stay."""
    from flashlane.planning.buffers import activation_bytes
    from flashlane.planning.memory import AUTO_SESSIONS_WANTED, narrower

    assert narrower(9) == [9, 5, 3, 2, 1] and narrower(4) == [4, 2, 1] and narrower(1) == [1]
    kw = dict(device="cpu", weight_bytes=10**6, context=16)
    row = sum(b.nbytes for b in scratch_buffers(TINY, 1, 8, 8))
    one = session_bytes(TINY, 16, 8, 8)
    assert row > one / 4  # a row's scratch worth a good part of a session here

    def limit(n: int) -> int:  # n sessions beside 9 rows each
        return 10**6 + activation_bytes(TINY, 64, "cpu", 0, 16) + n * (one + 9 * row) + row

    p = plan(TINY, limit_bytes=limit(4), max_rows=64, window_rows=9, **kw)
    assert 4 < p.num_sessions < AUTO_SESSIONS_WANTED and p.max_rows == p.num_sessions  # a row
    p = plan(TINY, limit_bytes=limit(6), max_rows=64, window_rows=9, **kw)
    assert p.num_sessions == MAX_AUTO_SESSIONS  # 18 would fit: the CPU's auto stops at 16
    p = plan(TINY, limit_bytes=limit(8), max_rows=64, window_rows=9, **kw)
    assert p.num_sessions == 16 and p.max_rows == 48  # 3 rows a session suffice for 16
    wide = plan(TINY, limit_bytes=limit(20), max_rows=64, window_rows=9, **kw)
    assert wide.num_sessions == 16 and wide.max_rows == 64


def test_plan_arithmetic() -> None:
    p = plan(TINY, device="cpu", limit_bytes=_limit(TINY, 10**6, 3.5), weight_bytes=10**6,
             max_rows=16)  # fmt: skip
    assert p.auto and p.capacities == (512,) * 3 and not p.serial
    assert p.scratch_bytes == 16 * 3 * (4 * 16 * 16 * 8 + 128 * 8)
    assert p.activation_bytes == 16 * 512 * 4 + 64 * 2**20
    assert p.budget_bytes == p.limit_bytes - p.weight_bytes - p.scratch_bytes - p.activation_bytes
    assert p.sessions_bytes == 3 * session_bytes(TINY, 512, 8, 8)
    assert 0 <= p.free_bytes < session_bytes(TINY, 512, 8, 8)
    text = describe(TINY, p)
    assert "sessions           3 (auto): 512x3 tokens" in text
    assert f"{p.budget_bytes:,} bytes" in text


def test_auto_caps_at_16_and_serves_one_reply_when_fewer_than_two_fit() -> None:
    roomy = plan(TINY, device="cpu", limit_bytes=_limit(TINY, 0, 40), weight_bytes=0, max_rows=16)
    assert roomy.num_sessions == 16
    tight = plan(TINY, device="cpu", limit_bytes=_limit(TINY, 0, 1.9), weight_bytes=0, max_rows=16)
    assert tight.capacities == (512,) and tight.serial
    with pytest.raises(OverMemoryLimit) as err:
        plan(TINY, device="cpu", limit_bytes=_limit(TINY, 0, 0.5), weight_bytes=0, max_rows=16)
    for remedy in ("--context", "--parallel", "--slot-contexts", "--prompt-cache-gb"):
        assert remedy in str(err.value)
    assert "--memory-limit-gb" in str(err.value)


def test_auto_plans_up_to_256_sessions_on_a_gpu() -> None:
    """A GPU's auto plan holds as many sessions as fit, up to 256 (the lone driver's step
    graphs take any number); the CPU's stays at 16."""
    # the GPU's workspace (element sizes, activations) differs: fit for it, cap from there
    room = 400 * session_bytes(TINY, 512, 2, 4)
    roomy = plan(TINY, device="cuda", limit_bytes=room + 2 * GIB, weight_bytes=0, max_rows=16)
    assert roomy.num_sessions == 256
    one = roomy.session_bytes[0]
    fixed = roomy.limit_bytes - roomy.budget_bytes  # weights, workspace, prompt cache
    some = plan(
        TINY, device="cuda", limit_bytes=fixed + int(100.5 * one), weight_bytes=0, max_rows=16
    )
    assert some.num_sessions == 100
    cpu = plan(TINY, device="cpu", limit_bytes=room + 2 * GIB, weight_bytes=0, max_rows=16)
    assert cpu.num_sessions == 16


def test_given_sizes_meet_the_same_ceiling() -> None:
    limit = _limit(TINY, 0, 2.5)
    assert plan(TINY, device="cpu", limit_bytes=limit, weight_bytes=0, max_rows=16,
                parallel=2).num_sessions == 2  # fmt: skip
    with pytest.raises(OverMemoryLimit, match="3 session"):
        plan(TINY, device="cpu", limit_bytes=limit, weight_bytes=0, max_rows=16, parallel=3)
    sized = plan(TINY, device="cpu", limit_bytes=limit, weight_bytes=0, max_rows=16,
                 slot_contexts=(512, 256, 128, 128))  # fmt: skip
    assert not sized.auto and sized.session_bytes[1] == session_bytes(TINY, 256, 8, 8)
    with pytest.raises(OverMemoryLimit, match="512x2,256"):
        plan(TINY, device="cpu", limit_bytes=limit, weight_bytes=0, max_rows=16,
             slot_contexts=(512, 512, 256))  # fmt: skip
    with pytest.raises(OverMemoryLimit, match="weights"):
        plan(TINY, device="cpu", limit_bytes=limit, weight_bytes=limit, max_rows=16)
    with pytest.raises(OverMemoryLimit, match="host"):
        plan(TINY, device="cuda", limit_bytes=GIB * 4, weight_bytes=0, max_rows=16,
             host_bytes=GIB, host_limit_bytes=GIB - 1)  # fmt: skip


def test_limit_resolution(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemFree:  10 kB\nMemTotal:       1048576 kB\n")
    assert read_ram_bytes(meminfo) == GIB
    assert resolve_limit_bytes(None, {}, "cpu", ram_total_bytes=100 * GIB) == 70 * GIB
    # the GPU's default: 10% kept out, or 5 GiB where that is less (over 50 GiB)
    assert resolve_limit_bytes(None, {}, "cuda", gpu_total_bytes=40 * GIB) == 36 * GIB
    assert resolve_limit_bytes(None, {}, "cuda", gpu_total_bytes=50 * GIB) == 45 * GIB
    assert resolve_limit_bytes(None, {}, "cuda", gpu_total_bytes=100 * GIB) == 95 * GIB
    assert resolve_limit_bytes(None, {LIMIT_ENV: "12.5"}, "cuda", 100 * GIB) == int(12.5 * GIB)
    assert resolve_limit_bytes("8", {LIMIT_ENV: "12.5"}, "cpu", None, GIB) == 8 * GIB
    assert resolve_limit_bytes(None, {LIMIT_ENV: ""}, "cpu", None, 10 * GIB) == 7 * GIB
    for bad in ("0", "-1", "abc", "nan", "inf", ""):
        with pytest.raises(ValueError, match="memory-limit-gb"):
            parse_limit_gb(bad)
    with pytest.raises(ValueError, match="total memory"):
        resolve_limit_bytes(None, {}, "cuda")


@pytest.mark.parametrize(
    ("options", "names"),
    [
        ({"parallel": 4, "slot_contexts": (64, 32)}, ("--parallel 4", "--slot-contexts")),
        ({"parallel": 0}, ("--parallel",)),
        ({"context": 1024}, ("--context 1024", "max_position_embeddings")),
        ({"slot_contexts": (1024, 64)}, ("--slot-contexts lists 1024", "window")),
        ({"slot_contexts": (256,), "context": 128}, ("--slot-contexts", "--context 128")),
        ({"max_rows": 3}, ("--max-rows 3", "--mtp-drafts 3")),
        ({"context": 2}, ("--context 2", "--mtp-drafts 3")),
        ({"slot_contexts": (64, 3)}, ("--slot-contexts 3", "--mtp-drafts")),
        ({"slot_grow": 100, "slot_contexts": (64,)}, ("--slot-grow 100", "--slot-contexts")),
    ],
)
def test_check_options_refuses_conflicts(options: dict, names: tuple[str, ...]) -> None:
    base = {"model_window": 512, "max_rows": 16, "mtp_drafts": 3}
    with pytest.raises(OptionConflict) as err:
        check_options(**{**base, **options})
    for name in names:
        assert name in str(err.value)


def test_check_options_accepts_what_holds() -> None:
    check_options(model_window=512, max_rows=16, mtp_drafts=3, slot_grow=64)
    # equal sessions never move, so the default grow margin may exceed them
    check_options(model_window=512, max_rows=16, mtp_drafts=3, slot_grow=8192)
    # the default margin (None: 8192) never refuses sessions smaller than it
    check_options(model_window=8192, max_rows=16, mtp_drafts=3, slot_contexts=(4096, 1024))
    check_options(model_window=512, max_rows=4, mtp_drafts=3, context=256, slot_grow=8)
    check_options(model_window=512, max_rows=1, mtp_drafts=3, drafts=False, slot_grow=8,
                  parallel=3, slot_contexts=(512, 64, 8))  # fmt: skip


def test_sessions_and_census_import_no_torch() -> None:
    code = (
        "import sys, flashlane.planning.memory, flashlane.sessions.slots, flashlane.models.census,"
        " flashlane.models.weight_bytes, flashlane.planning.info;"
        "sys.exit('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
