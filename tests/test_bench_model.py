"""`flashlane bench model` runs end to end on the CPU (the toy preset), peer included, and
random checkpoints give transformers the same weights as ours."""

import json

import pytest
import torch

from flashlane.bench.model import bench_model_main
from flashlane.models.flashnext import run_piece
from flashlane.models.presets import PRESETS, preset
from flashlane.models.random_weights import build_random, fill_transformers
from flashlane.models.state import SessionState


def test_bench_model_smoke_on_cpu(tmp_path, capsys):
    out = tmp_path / "r.json"
    argv = [
        "--config",
        "flashnext-tiny",
        "--random-weights",
        "--device",
        "cpu",
        "--streams",
        "1,2",
        "--prefill",
        "128",
        "--decode-tokens",
        "4",
        "--peer",
        "transformers",
        "--peer-prefill",
        "128",
        "--prompt-cache",
        "300",
        "--sampled",
        "--json",
        str(out),
    ]
    assert bench_model_main(argv) == 0
    result = json.loads(out.read_text())
    assert set(result["ours"]["decode"]) == {"1", "2"}
    prefill = result["ours"]["prefill"]["128"]
    assert prefill["tok_s"] > 0 and len(prefill["ttft_runs_s"]) == 5  # --prefill-repeats
    assert prefill["ttft_runs_s"] == sorted(prefill["ttft_runs_s"])
    assert prefill["ttft_min_s"] <= prefill["ttft_s"] and prefill["spread"] >= 0
    assert result["peer"]["decode"]["2"]["tok_s"] > 0
    cache = result["ours"]["prompt_cache"]
    assert cache["resent"]["cached_tokens"] > 0 and cache["cold"]["cached_tokens"] == 0
    runs = {"greedy", "top_k 40", "top_p 0.9", "penalties", "logprobs 5"}
    assert set(result["ours"]["decode_sampled"]) == runs
    printed = capsys.readouterr().out
    assert "decode 2 streams" in printed and "decode 1 stream, top_p 0.9" in printed


def test_bench_model_with_an_8bit_cache_counts_its_bytes(tmp_path):
    """--kv-cache-dtype fp8: the engine's sessions are 8-bit and the roofline's round reads
    the cache's stored bytes, fewer than the plain cache's."""
    rounds = {}
    for kv in ("auto", "fp8"):
        out = tmp_path / f"{kv}.json"
        argv = ["--config", "flashnext-tiny", "--random-weights", "--device", "cpu"]
        argv += ["--streams", "1", "--prompt-len", "300", "--prefill", "64"]
        argv += ["--decode-tokens", "2", "--peer", "none", "--kv-cache-dtype", kv]
        assert bench_model_main([*argv, "--json", str(out)]) == 0
        rounds[kv] = json.loads(out.read_text())["ours"]["decode"]["1"]["round_bytes"]
    assert rounds["fp8"] < rounds["auto"]


def test_bench_model_decodes_at_each_prompt_length(tmp_path, capsys):
    """--prompt-len 8,300 (issue 29's long contexts, here short): decode at the first length
    in `decode`, at the others in `decode_context`, each against its own roofline bytes."""
    out = tmp_path / "r.json"
    argv = ["--config", "flashnext-tiny", "--random-weights", "--device", "cpu"]
    argv += ["--streams", "1,2", "--prompt-len", "8,300", "--prefill", "64"]
    argv += ["--decode-tokens", "4", "--peer", "none", "--json", str(out)]
    assert bench_model_main(argv) == 0
    ours = json.loads(out.read_text())["ours"]
    assert set(ours["decode"]) == {"1", "2"} and set(ours["decode_context"]) == {"300"}
    short, long = ours["decode"]["2"], ours["decode_context"]["300"]["2"]
    assert long["tok_s"] > 0 and long["round_bytes"] > short["round_bytes"]
    assert "decode 2 at 300" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench_model_main([*argv[:5], "--prompt-len", "0"])
    with pytest.raises(SystemExit):
        bench_model_main([*argv[:5], "--prefill-repeats", "0"])


def test_bench_model_with_8bit_host_tables(tmp_path, monkeypatch):
    """--ple-table-dtype int8: the random tables drawn straight into 8 bits in host memory
    (random_weights._host_table); the run decodes; with --ple-table-device cuda refused."""
    import flashlane.bench.model as bench
    from flashlane.models.host_tables import host_bytes, table_dtype_of

    built = []

    def recorded(*args, **kwargs):
        built.append(build_random(*args, **kwargs)[1])
        return built[-1].cfg, built[-1]

    monkeypatch.setattr(bench, "build_random", recorded)
    out = tmp_path / "r.json"
    argv = ["--config", "flashnext-tiny", "--random-weights", "--device", "cpu"]
    argv += ["--streams", "1", "--prompt-len", "8", "--prefill", "16", "--decode-tokens", "2"]
    argv += ["--peer", "none", "--ple-table-dtype", "int8", "--json", str(out)]
    assert bench_model_main(argv) == 0
    assert json.loads(out.read_text())["ours"]["decode"]["1"]["tok_s"] > 0
    assert table_dtype_of(built[0]) == "int8" and host_bytes(built[0]) > 0
    with pytest.raises(SystemExit):
        bench_model_main([*argv, "--ple-table-device", "cuda"])


def test_a_failed_reply_is_an_error_not_a_figure():
    from flashlane.bench.model_figures import replies
    from flashlane.request import FinishReason, RequestOutput

    ok = RequestOutput("a", [1], [2], "", FinishReason.LENGTH, 0)
    failed = RequestOutput(
        "b",
        [1] * 8192,
        [],
        "",
        FinishReason.ERROR,
        0,
        error="InvalidBatch: 8192 prompt rows exceed 4096",
    )
    assert replies([ok]) == [ok]
    with pytest.raises(RuntimeError, match="InvalidBatch"):
        replies([ok, failed])


def test_engine_prompt_pieces_fit_its_backend():
    """The host cuts prompts into pieces of prefill_rows; the backend refuses more than
    max_prompt_rows: one number, so no piece is refused."""
    from flashlane.config import EngineConfig
    from flashlane.engine import Engine

    cfg, model = build_random(preset("flashnext-tiny"), torch.float32, "cpu", seed=1)
    config = EngineConfig.resolve(
        device="cpu", parallel=1, context=256, drafts=False, prompt_cache_gb=0
    )
    engine = Engine(config, built=(cfg, model), log=lambda *_: None)
    assert engine.host.config.prefill_rows == engine.backend.max_prompt_rows


def test_random_checkpoint_is_the_same_in_transformers():
    from transformers import Qwen4ExpForCausalLM, Qwen4ExpTextConfig

    raw = preset("flashnext-tiny")
    cfg, ours = build_random(raw, torch.float32, "cpu", seed=5)
    spec = {k: v for k, v in raw.items() if k != "model_type"}
    theirs = Qwen4ExpForCausalLM(Qwen4ExpTextConfig(**spec))
    fill_transformers(theirs, seed=5)
    # 10 tokens: the dense region (past it the peer breaks the indexer's ties its own way)
    ids = torch.randint(3, cfg.vocab_size, (10,), generator=torch.Generator().manual_seed(1))
    s = SessionState.empty(cfg, 64, torch.float32, torch.float32, "cpu")
    got = run_piece(ours, s, ids, 0, recurrent=False)
    want = theirs(ids[None]).logits[0].float()
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


@pytest.mark.parametrize("name", ["qwen3-next-tiny", "qwen3.5-moe-tiny", "qwen3.5-tiny"])
def test_random_sibling_checkpoint_is_the_same_in_transformers(name):
    from tests.oracle import hf_classes

    raw = preset(name)
    cfg, ours = build_random(raw, torch.float32, "cpu", seed=5)
    spec = {k: v for k, v in raw.items() if k not in ("model_type", "mtp_num_hidden_layers")}
    model_class, config_class = hf_classes(raw["model_type"])
    theirs = model_class(config_class(**spec))
    fill_transformers(theirs, seed=5)
    ids = torch.randint(3, cfg.vocab_size, (40,), generator=torch.Generator().manual_seed(1))
    s = SessionState.empty(cfg, 64, torch.float32, torch.float32, "cpu")
    got = run_piece(ours, s, ids, 0, recurrent=False)
    want = theirs(ids[None]).logits[0].float()
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


def test_bench_model_peer_transformers_builds_the_siblings_class(tmp_path):
    """--peer transformers on a sibling config times the sibling's transformers class (it
    built Flash Next's whatever the config)."""
    out = tmp_path / "r.json"
    argv = ["--config", "qwen3.5-moe-tiny", "--random-weights", "--device", "cpu"]
    argv += ["--streams", "1", "--prefill", "16", "--decode-tokens", "2", "--peer"]
    argv += ["transformers", "--peer-prefill", "16", "--json", str(out)]
    assert bench_model_main(argv) == 0
    peer = json.loads(out.read_text())["peer"]
    assert peer["model"] == "Qwen3_5MoeForCausalLM" and peer["decode"]["1"]["tok_s"] > 0


def test_bench_model_smoke_on_cpu_for_a_sibling(tmp_path):
    out = tmp_path / "r.json"
    argv = [
        "--config",
        "qwen3-next-tiny",
        "--random-weights",
        "--device",
        "cpu",
        "--streams",
        "1,2",
        "--prefill",
        "128",
        "--decode-tokens",
        "4",
        "--json",
        str(out),
    ]
    assert bench_model_main(argv) == 0
    result = json.loads(out.read_text())
    assert result["ours"]["decode"]["2"]["tok_s"] > 0
    assert result["ours"]["prefill"]["128"]["tok_s"] > 0


def test_presets_parse_and_real_sizes():
    from flashlane.models.census import count_params
    from flashlane.models.config import ModelConfig

    sizes = {n: count_params(ModelConfig.from_hf(preset(n))).loaded for n in PRESETS}
    assert 35e9 < sizes["flashnext-12l"] < 36e9  # fits one H200 in bf16, a peer copy does not
    assert sizes["flashnext-48l"] > 170e9
    totals = {n: count_params(ModelConfig.from_hf(preset(n))).total for n in PRESETS}
    assert totals["qwen3-next-48l"] == 79_674_391_296  # Qwen3-Next-80B-A3B: "79.67B"
    assert 34e9 < totals["qwen3.5-moe-40l"] < 36e9  # the "35B-A3B style" defaults
    assert 8.5e9 < totals["qwen3.5-32l"] < 9.5e9  # the "9B style" defaults
    assert 20e9 < sizes["qwen3-next-12l"] < 23e9  # size-faithful layers, a quarter deep


def test_a_prefill_the_engine_cannot_run_ends_its_row_only(tmp_path, capsys, monkeypatch):
    """A --prefill length whose warm prompt fails (the full FP8 model's 8k prompt ran out of
    memory on the H200) is an error in its row; the decode figures and other lengths stay."""
    from flashlane.bench import model as bench

    def replies(outs):
        if len(outs[0].prompt_token_ids) == 96:
            raise RuntimeError("bench model: request llm-9 failed: OutOfMemoryError: test")
        return outs

    monkeypatch.setattr(bench, "replies", replies)
    out = tmp_path / "r.json"
    argv = ["--config", "flashnext-tiny", "--random-weights", "--device", "cpu"]
    argv += ["--streams", "1", "--prefill", "64,96", "--decode-tokens", "2"]
    assert bench_model_main([*argv, "--json", str(out)]) == 0
    ours = json.loads(out.read_text())["ours"]
    assert ours["decode"]["1"]["tok_s"] > 0 and ours["prefill"]["64"]["tok_s"] > 0
    assert "OutOfMemoryError" in ours["prefill"]["96"]["error"]
    lines = capsys.readouterr().out.splitlines()
    assert any(ln.startswith("prefill 96 tokens") and "failed" in ln for ln in lines)


def test_an_fp8_prefill_is_shown_against_the_e4m3_matrix_rate():
    """An FP8 model's prefill row (bench model --quantization fp8 measures the e4m3 rate with
    the ceilings): the table's figure is its share of that rate, and says so; a bf16 row
    keeps the bf16 rate's share."""
    from flashlane.bench.model_table import table

    row = dict(tok_s=8000.0, ttft_runs_s=[1.0, 1.0, 1.0], spread=0.01, of_matrix_rate=0.14)
    result = {"ours": {"decode": {}, "prefill": {8192: dict(row, of_fp8_matrix_rate=0.07)}}}
    text = table(result)
    assert "7%" in text and "of the e4m3 matrix rate" in text and "14%" not in text
    result["ours"]["prefill"][8192] = row
    text = table(result)
    assert "14%" in text and "e4m3" not in text


def test_a_failed_capture_fails_the_run(capsys):
    """Figures of eager lone steps are not the product's (H200 at 1a68afd: every lone
    capture failed and one stream decoded at 7% of the roofline): the run exits 1 and says
    why, where it would have exited 0."""
    from flashlane.bench.model_table import failed_exit

    ok = {"ours": {"lone_failed": None, "graphs": {"failed": None}}}
    assert failed_exit(ok) == 0 and capsys.readouterr().err == ""
    why = "AttributeError: 'AbsorbBuffers' object has no attribute 'tok'"
    assert failed_exit({"ours": {"lone_failed": why}}) == 1
    assert why in capsys.readouterr().err
    assert failed_exit({"ours": {"graphs": {"failed": "OOM"}}}) == 1
