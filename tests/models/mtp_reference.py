"""A small, readable MTP head written straight from REFERENCE.md section 2, one query at a
time, from the checkpoint's own tensor names. It shares no code with flashlane.models."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def norm(x, w, eps, group=None, centred=True):
    shape = x.shape
    if group:
        x = x.reshape(*shape[:-1], -1, group)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return x.reshape(shape) * ((1 + w) if centred else w)


def rope(x, pos, rd, theta):
    inv = 1.0 / theta ** (torch.arange(0, rd, 2, dtype=torch.float32) / rd)
    ang = torch.cat([pos * inv, pos * inv]).to(torch.float32)
    c, s = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    xr = x[..., :rd]
    rot = torch.cat([-xr[..., rd // 2 :], xr[..., : rd // 2]], -1)
    return torch.cat([xr * c + rot * s, x[..., rd:]], -1)


def hyper(t, p, r, hc, h, eps):
    xn = norm(r, t[p + "hc_norm.weight"], eps, group=h)
    mix = torch.sigmoid(
        F.silu(xn @ t[p + "input_mix_weight_down.weight"].T / hc)
        @ t[p + "input_mix_weight_up.weight"].T
    )
    a = (mix * xn).reshape(hc, h).mean(0)
    w = (
        2 * torch.sigmoid(xn @ t[p + "block_inject_weight.weight"].T / hc)
        if p + "block_inject_weight.weight" in t
        else None
    )
    return a, w


def mtp_logits(t: dict, cfg: dict, residuals: torch.Tensor, next_ids: torch.Tensor) -> torch.Tensor:
    """residuals [T, hc*H] (R_i), next_ids [T] (x_{i+1}) -> logits [T, V] for x_{i+2}."""
    h, hc, eps = cfg["hidden_size"], cfg["hc_count"], cfg["rms_norm_eps"]
    d, nh, nkv = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    di, blk = cfg["indexer_head_dim"], cfg["indexer_compress_ratio"]
    top = cfg["indexer_budget"] // blk
    rd = int(d * cfg["rope_parameters"]["partial_rotary_factor"])
    theta = cfg["rope_parameters"]["rope_theta"]
    L = "mtp.layers.0."
    keys, values, raw = [], [], []
    out = []
    for i in range(len(next_ids)):
        e = (
            norm(
                t["model.embed_tokens.weight"][next_ids[i]],
                t["mtp.pre_fc_norm_embedding.weight"],
                eps,
            )
            @ t["mtp.fc_embedding.weight"].T
        )
        hn = norm(residuals[i], t["mtp.pre_fc_norm_hidden.weight"], eps).reshape(hc, h)
        r = (hn @ t["mtp.fc_hidden.weight"].T + e).reshape(-1)
        a, w = hyper(t, L + "attn_hyper_connection.", r, hc, h, eps)
        qg = (a @ t[L + "self_attn.q_proj.weight"].T).reshape(nh, 2 * d)
        q = rope(norm(qg[:, :d], t[L + "self_attn.q_norm.weight"], eps), i, rd, theta)
        k = rope(
            norm(
                (a @ t[L + "self_attn.k_proj.weight"].T).reshape(nkv, d),
                t[L + "self_attn.k_norm.weight"],
                eps,
            ),
            i,
            rd,
            theta,
        )
        keys.append(k)
        values.append((a @ t[L + "self_attn.v_proj.weight"].T).reshape(nkv, d))
        iqk = a @ t[L + "self_attn.indexer.index_qk_proj.weight"].T
        iq = rope(
            norm(iqk[:-di].reshape(-1, di), t[L + "self_attn.indexer.q_layernorm.weight"], eps),
            i,
            rd,
            theta,
        )
        raw.append(iqk[-di:])
        visible = list(range(i + 1))
        nb = (i + 1) // blk
        if nb > top:
            scores = []
            for b in range(nb):
                kb = norm(
                    torch.stack(raw[b * blk : (b + 1) * blk]).mean(0),
                    t[L + "self_attn.indexer.k_layernorm.weight"],
                    eps,
                )
                kb = rope(kb, b * blk, rd, theta)
                scores.append(
                    sum(torch.relu(iq[j] @ kb) for j in range(iq.shape[0])) / math.sqrt(di)
                )
            order = sorted(range(nb), key=lambda b: (-float(scores[b]), b))[:top]
            visible = [p for b in sorted(order) for p in range(b * blk, (b + 1) * blk)] + list(
                range(nb * blk, i + 1)
            )
        K, V = torch.stack([keys[p] for p in visible]), torch.stack([values[p] for p in visible])
        rep = nh // nkv
        att = []
        for head in range(nh):
            s = K[:, head // rep] @ q[head] / math.sqrt(d)
            att.append(torch.softmax(s, 0) @ V[:, head // rep])
        y = (torch.cat(att) * torch.sigmoid(qg[:, d:].reshape(-1))) @ t[
            L + "self_attn.o_proj.weight"
        ].T
        r = r + (y[None] * w[:, None]).reshape(-1)
        a, w = hyper(t, L + "mlp_hyper_connection.", r, hc, h, eps)
        probs = torch.softmax(a @ t[L + "mlp.gate.weight"].T, 0)
        order = sorted(range(len(probs)), key=lambda j: (-float(probs[j]), j))[
            : cfg["num_experts_per_tok"]
        ]
        wts = probs[order] / probs[order].sum()
        y = 0
        for wt, ex in zip(wts, order):
            p = f"{L}mlp.experts.{ex}."
            y = y + wt * (
                (F.silu(a @ t[p + "gate_proj.weight"].T) * (a @ t[p + "up_proj.weight"].T))
                @ t[p + "down_proj.weight"].T
            )
        se = L + "mlp.shared_expert."
        shared = (F.silu(a @ t[se + "gate_proj.weight"].T) * (a @ t[se + "up_proj.weight"].T)) @ t[
            se + "down_proj.weight"
        ].T
        y = y + torch.sigmoid(a @ t[L + "mlp.shared_expert_gate.weight"].T) * shared
        r = r + (y[None] * w[:, None]).reshape(-1)
        hidden, _ = hyper(t, "mtp.hyper_connection_mixer.", r, hc, h, eps)
        out.append(hidden @ t["lm_head.weight"].T)
    return torch.stack(out)
