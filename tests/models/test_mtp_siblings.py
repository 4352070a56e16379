"""The siblings' MTP head (`mtp.*`, which transformers drops) against a reference built from
transformers' own modules: the family's decoder layer (gated full attention and its MLP) and
rotary embedding, loaded with the checkpoint's mtp.layers.0 weights. The head around that
layer follows vLLM's qwen3_next_mtp.py / qwen3_5_mtp.py: fc over [norm_e(embed(x_{i+1})),
norm_h(h_i)], the layer, then `norm` before the shared lm_head."""

import json

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from flashlane.models.loader import load_checkpoint
from tests.oracle import hf_classes


def zero_centred_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1 + w)


def hf_mtp_layer(hf, tensors: dict, cfg):
    """A fresh transformers decoder layer of the family (the first full-attention layer's
    class and MLP kind) holding the checkpoint's mtp.layers.0 weights."""
    idx = next(
        i
        for i, t in enumerate(hf.config.layer_types)
        if t == "full_attention" and cfg.is_moe_layer(i) == bool(cfg.num_experts)
    )
    layer = type(hf.model.layers[idx])(hf.config, idx).double().eval()
    mine = {
        k.removeprefix("mtp.layers.0."): v
        for k, v in tensors.items()
        if k.startswith("mtp.layers.0.")
    }
    state = {}
    for name in layer.state_dict():
        if name.endswith("experts.gate_up_proj"):
            base = name.removesuffix("gate_up_proj")
            state[name] = torch.stack([
                torch.cat([mine[f"{base}{e}.gate_proj.weight"], mine[f"{base}{e}.up_proj.weight"]])
                for e in range(cfg.num_experts)
            ])  # fmt: skip
        elif name.endswith("experts.down_proj"):
            base = name.removesuffix("down_proj")
            state[name] = torch.stack(
                [mine[f"{base}{e}.down_proj.weight"] for e in range(cfg.num_experts)]
            )
        else:
            state[name] = mine[name]
    layer.load_state_dict(state, strict=True)
    return layer


def test_sibling_mtp_head_matches_transformers_layers(sibling_ckpt):
    cfg, model = load_checkpoint(sibling_ckpt, dtype=torch.float64)
    raw = json.loads((sibling_ckpt / "config.json").read_text())
    # the eager experts: the grouped-GEMM ones take no fp64
    hf = hf_classes(raw["model_type"])[0].from_pretrained(
        sibling_ckpt, dtype=torch.float64, experts_implementation="eager"
    )
    t = {
        k: v.double()
        for k, v in load_file(str(sibling_ckpt / "model.safetensors")).items()
        if k.startswith("mtp.")
    }
    g = torch.Generator().manual_seed(0)
    n = 25
    ids = torch.randint(3, cfg.vocab_size, (1, n), generator=g)
    nxt = torch.randint(3, cfg.vocab_size, (1, n), generator=g)
    _, hidden = model.forward_train(ids)  # the final norm's output: what the head reads
    ours, _ = model.mtp_forward_train(hidden, nxt)

    eps = cfg.rms_eps
    e = zero_centred_norm(model.embed_tokens(nxt), t["mtp.pre_fc_norm_embedding.weight"], eps)
    h = zero_centred_norm(hidden, t["mtp.pre_fc_norm_hidden.weight"], eps)
    x = F.linear(torch.cat([e, h], dim=-1), t["mtp.fc.weight"])
    pos = torch.arange(n)[None]
    if raw["model_type"] != "qwen3_next":  # mRoPE: three equal position rows for text
        pos = pos[None].expand(3, 1, n)
    cos_sin = hf.model.rotary_emb(x, pos)
    mask = torch.full((n, n), float("-inf"), dtype=torch.float64).triu(1)[None, None]
    with torch.no_grad():
        out = hf_mtp_layer(hf, t, cfg)(x, position_embeddings=cos_sin, attention_mask=mask)
        out = out[0] if isinstance(out, tuple) else out
        ref = F.linear(zero_centred_norm(out, t["mtp.norm.weight"], eps), model.lm_head.weight)
    # transformers takes the softmax (and the rope angles) in fp32 even in an fp64 model
    err = (ours - ref).abs().max().item()
    assert err <= 1e-5 * ref.abs().max().item(), err
