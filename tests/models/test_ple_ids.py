"""PLE row ids and multipliers equal transformers' for EOS-laden histories."""

import torch
from transformers import Qwen4ExpTextConfig
from transformers.models.qwen4_exp import modeling_qwen4_exp as hf

from flashlane.models.config import ModelConfig
from flashlane.models.layers.ple import NGramEmbedding
from tests.oracle import OTHER, TINY


def check(spec, ple_index):
    hf_cfg = Qwen4ExpTextConfig(**spec)
    theirs = hf.Qwen4ExpTextNGramEmbedding(hf_cfg, spec["ple_embed_dim"], 1, ple_index)
    ours = NGramEmbedding(ModelConfig.from_hf(hf_cfg.to_dict()), ple_index)
    assert ours.layer_multipliers.tolist() == theirs.layer_multipliers.tolist()
    assert ours.ngram_heads_vocab_sizes.tolist() == theirs.ngram_heads_vocab_sizes.tolist()
    assert ours.ngram_heads_offsets.tolist() == theirs.ngram_heads_offsets.tolist()
    eos = spec["eos_token_id"]
    ids = torch.randint(0, spec["vocab_size"], (2, 50))
    ids[0, [0, 7, 8, 20]] = eos
    ids[1, [1, 49]] = eos
    want = []
    for row in ids:  # transformers' ids via its cumulative-EOS shift, without a cache
        captured = {}
        hook = theirs.ngram_embedding.register_forward_hook(
            lambda mod, args, out, c=captured: c.setdefault("ids", args[0])
        )
        theirs.forward(row.unsqueeze(0), None)
        hook.remove()
        want.append(captured["ids"][0])
    hist = torch.cat([torch.full((2, spec["ngram_size"] - 1), eos), ids], dim=1)
    assert torch.equal(ours.row_ids(hist), torch.stack(want))


def test_ple_ids_tiny():
    check(TINY, 0)


def test_ple_ids_other_second_layer():
    check(OTHER, 1)
