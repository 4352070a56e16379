"""FP8 on the GPU (issue 34), bit for bit as bf16 (DESIGN.md section 1): a model whose linears
and experts are kept in block FP8 (Fp8Weight, the Triton FP8 GEMMs) gives a row the same
logits whatever the verify width and the other streams; a block-FP8 checkpoint's replies
agree batched, drafted and alone; the n-gram tables in host memory (read through mapped
memory) reply as the tables on the GPU. The kernels' own tests: tests/kernels/
test_triton_fp8.py and test_triton_moe_fp8.py (also marked cuda)."""

import dataclasses

import pytest
import torch

from flashlane.kernels import select_kernels
from flashlane.lanes.records import CostTable, Draws, Window
from flashlane.llm import LLM
from flashlane.models.fp8_weights import fp8_weights
from flashlane.models.presets import preset
from flashlane.models.random_weights import build_random
from flashlane.request import SamplingParams
from flashlane.runner.backend import ModelBackend
from tests.gpu.test_exact_gpu import new_session, prefilled, prompts, run_windows
from tests.models.test_fp8 import fp8_trio  # noqa: F401 (a fixture)

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]
COSTS = CostTable({1: 1.0, 2: 1.05, 4: 1.1, 8: 1.2, 16: 1.4}, draft_step_ms=0.3, overhead_ms=0.2)


@pytest.fixture(scope="module")
def fp8_model():
    cfg, model = build_random(preset("flashnext-4l"), torch.bfloat16, "cuda", 1, quantize="fp8")
    assert fp8_weights(model), "the weights were not kept in FP8 on cuda"
    model.use_kernels(select_kernels("cuda"))
    yield cfg, model
    del model
    torch.cuda.empty_cache()


@pytest.mark.parametrize("streams", [2, 8, 16])
def test_fp8_shared_round_rows_equal_alone_bitwise(fp8_model, streams):
    cfg, model = fp8_model
    sessions = [prefilled(cfg, model, p) for p in prompts(cfg.vocab_size, streams)]
    g = torch.Generator().manual_seed(streams)
    windows = [
        (s, torch.randint(3, cfg.vocab_size, (1 + i % 4,), generator=g).tolist())
        for i, s in enumerate(sessions)
    ]
    together = run_windows(model, windows)
    for (s, t), lg in zip(windows, together):
        assert torch.isfinite(lg).all()
        assert torch.equal(lg, run_windows(model, [(s, t)])[0])


def test_fp8_checkpoint_replies_agree_batched_drafted_and_alone(fp8_trio):  # noqa: F811
    _, fp8, _ = fp8_trio
    llm = LLM(str(fp8), costs=COSTS, parallel=8, max_rows=16, device="cuda")
    assert fp8_weights(llm.engine.model)
    ps = prompts(500, 8)
    for params in (
        SamplingParams(max_tokens=24, temperature=0.0),
        SamplingParams(max_tokens=24, temperature=0.9, top_p=0.95, seed=11),
    ):
        plist = [dataclasses.replace(params, draft=(i % 3 != 1)) for i in range(len(ps))]
        together = llm.generate(ps, plist)
        for prompt, p, got in zip(ps, plist, together):
            alone = llm.generate(prompt, dataclasses.replace(p, draft=False))[0]
            assert got.error is None and got.token_ids == alone.token_ids


def test_host_tables_read_through_mapped_memory_reply_the_same(tiny_ckpt):
    in_place = LLM(str(tiny_ckpt), costs=COSTS, parallel=4, max_rows=16, device="cuda")
    on_host = LLM(
        str(tiny_ckpt), costs=COSTS, parallel=4, max_rows=16, device="cuda", ple_table_device="cpu"
    )
    assert on_host.engine.plan.host_bytes > 0
    table = next(
        m.ngram_embedding.weight
        for m in on_host.engine.model.modules()
        if hasattr(m, "on_host") and m.on_host
    )
    assert table.device.type == "cpu" and table.is_pinned()
    ps = prompts(500, 4)
    params = SamplingParams(max_tokens=16, temperature=0.0)
    assert [o.token_ids for o in on_host.generate(ps, params)] == [
        o.token_ids for o in in_place.generate(ps, params)
    ]


def test_int8_host_tables_through_mapped_memory_give_the_reference_bits(tiny_ckpt):
    """8-bit tables in host memory (models/table8.py): the Triton ngram_embed reading them
    through mapped memory gives the reference's bits (rows and scales gathered on the host,
    copied in, read back); replies batched equal alone."""
    from flashlane.kernels import REFERENCE
    from flashlane.models.layers.ple import NGramEmbedding

    llm = LLM(
        str(tiny_ckpt), costs=COSTS, parallel=4, max_rows=16, device="cuda", ple_table_dtype="int8"
    )
    assert llm.engine.plan.host_dtype == "int8"
    layers = [m for m in llm.engine.model.modules() if isinstance(m, NGramEmbedding)]
    assert layers and all(m.on_host and m.ops.name == "triton" for m in layers)
    table = layers[0].ngram_embedding
    assert table.q.device.type == "cpu" and table.q.is_pinned() and table.scale.is_pinned()
    cfg = llm.engine.model_config
    g = torch.Generator(device="cuda").manual_seed(8)
    history = torch.randint(
        0, cfg.vocab_size, (3, cfg.ngram_size - 1 + 9), generator=g, device="cuda"
    )
    history[1, 4] = cfg.ple_eos
    for m in layers:
        got, ops = m.embed(history), m.ops
        m.ops = REFERENCE
        try:
            want = m.embed(history)
        finally:
            m.ops = ops
        assert got.dtype == torch.bfloat16 and torch.equal(got, want)
    ps = prompts(500, 4)
    params = SamplingParams(max_tokens=16, temperature=0.0)
    together = [o.token_ids for o in llm.generate(ps, params)]
    assert together == [llm.generate(p, params)[0].token_ids for p in ps]


def test_fp8_prompt_rows_keep_their_bits_beside_decode_rows(fp8_model):
    """kernels/row_kind.py: a forward of decode windows and prompt pieces runs each kind in
    its own tiles (prompt rows on wgmma, decode rows on mma.sync). A prompt fed in the same
    pieces gives the same rows alone and beside other streams' decode windows, and those
    windows the rows they give in a forward of decode rows alone."""
    cfg, model = fp8_model
    ps = prompts(cfg.vocab_size, 16)
    prompt, others = ps[8], ps[:3]  # 200 tokens; three streams that decode
    b = ModelBackend(model, [new_session(cfg) for _ in range(6)], max_rows=64)
    assert b.row_kinds
    greedy = SamplingParams(temperature=0.0)
    for i, p in enumerate(others, start=1):
        b.verify([Window(i, i, 0, tuple(p), Draws(greedy, 0, p, []), "prompt", True)])
        b.keep({i: len(p)})

    def decode_windows():
        return [
            Window(i, i, len(p), (5, 6, 7)[:i], Draws(greedy, 0, p, [5]))
            for i, p in enumerate(others, start=1)
        ]

    def fed(windows):
        b.verify(windows)
        return {w.stream_id: b.fed[w.stream_id].residual.clone() for w in windows}

    alone = fed(decode_windows())
    for cuts in ([], [64, 128]):
        rows = {}
        for sid, session, beside in ((10, 4, False), (11, 5, True)):
            got = []
            for a, z in zip([0, *cuts], [*cuts, len(prompt)]):
                draws = Draws(greedy, 0, prompt, [])
                piece = Window(
                    sid, session, a, tuple(prompt[a:z]), draws, "prompt", z == len(prompt)
                )
                out = fed([*decode_windows(), piece] if beside else [piece])
                got.append(out[sid])
                for w in decode_windows() if beside else []:
                    assert torch.equal(out[w.stream_id], alone[w.stream_id])
                b.keep({sid: z - a})
            rows[beside] = torch.cat(got)
            b.release(sid)
        assert torch.equal(rows[True], rows[False]), f"pieces cut at {cuts}"
