"""Loader: sharded files, prefixes, and bad checkpoints with precise errors."""

import json
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from flashlane.models.loader import CheckpointError, load_checkpoint


@pytest.fixture
def ckpt(tmp_path, tiny_ckpt):
    folder = tmp_path / "ckpt"
    shutil.copytree(tiny_ckpt, folder)
    return folder


def tensors(folder):
    return load_file(str(folder / "model.safetensors"))


def save(folder, t):
    save_file(t, str(folder / "model.safetensors"), metadata={"format": "pt"})


def test_sharded_with_index_and_language_model_prefix(ckpt):
    _, ref = load_checkpoint(ckpt)
    t = tensors(ckpt)
    renamed = {
        k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k: v
        for k, v in t.items()
    }
    names = sorted(renamed)
    half = len(names) // 2
    (ckpt / "model.safetensors").unlink()
    save_file({n: renamed[n] for n in names[:half]}, str(ckpt / "a.safetensors"))
    save_file({n: renamed[n] for n in names[half:]}, str(ckpt / "b.safetensors"))
    index = {
        "weight_map": {n: ("a" if i < half else "b") + ".safetensors" for i, n in enumerate(names)}
    }
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    _, got = load_checkpoint(ckpt)
    for (n, a), (_, b) in zip(ref.state_dict().items(), got.state_dict().items()):
        assert torch.equal(a, b), n


def test_mtp_loaded(ckpt):
    _, m = load_checkpoint(ckpt)
    assert m.mtp is not None
    assert torch.equal(m.mtp.fc_hidden.weight, tensors(ckpt)["mtp.fc_hidden.weight"])


def test_missing_tensor(ckpt):
    t = tensors(ckpt)
    del t["model.layers.0.linear_attn.A_log"]
    save(ckpt, t)
    with pytest.raises(
        CheckpointError,
        match=r"missing tensor 'layers.0.linear_attn.A_log' \(expected shape \(4,\)\)",
    ):
        load_checkpoint(ckpt)


def test_wrong_shape(ckpt):
    t = tensors(ckpt)
    t["model.layers.0.linear_attn.in_proj_z.weight"] = torch.zeros(3, 64)
    save(ckpt, t)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(ckpt)
    msg = str(err.value)
    assert "layers.0.linear_attn.in_proj_z.weight" in msg and "(3, 64)" in msg and "(64, 64)" in msg
    assert "model.safetensors" in msg


def test_unexpected_tensor(ckpt):
    t = tensors(ckpt)
    t["model.layers.0.bogus.weight"] = torch.zeros(2)
    save(ckpt, t)
    with pytest.raises(CheckpointError, match=r"unexpected tensor 'layers\.0\.bogus\.weight'"):
        load_checkpoint(ckpt)


def test_truncated_file(ckpt):
    data = (ckpt / "model.safetensors").read_bytes()
    (ckpt / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"model\.safetensors"):
        load_checkpoint(ckpt)


def test_unknown_model_type(ckpt):
    raw = json.loads((ckpt / "config.json").read_text())
    raw["model_type"] = "gpt2"
    (ckpt / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="'model_type'"):
        load_checkpoint(ckpt)


def fuse_experts(t: dict) -> dict:
    """Per-expert `model.layers.N.mlp.experts.E.*` as transformers' fused [E, 2I, H]
    gate_up_proj and [E, H, I] down_proj."""
    out, groups = {}, {}
    for k, v in t.items():
        m = re.match(r"^(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(\w+_proj)\.weight$", k)
        if m:
            groups.setdefault(m.group(1), {})[(int(m.group(2)), m.group(3))] = v
        else:
            out[k] = v
    for base, w in groups.items():
        n = 1 + max(e for e, _ in w)
        out[base + ".down_proj"] = torch.stack([w[(e, "down_proj")] for e in range(n)])
        out[base + ".gate_up_proj"] = torch.stack(
            [torch.cat([w[(e, "gate_proj")], w[(e, "up_proj")]]) for e in range(n)]
        )
    return out


@pytest.mark.parametrize("name", ["qwen3_5_moe", "qwen3_5"])
def test_sibling_layouts_load_alike(tmp_path, oracle_by_name, name):
    """A Qwen3.5 checkpoint as its multimodal release ships it (a root config holding the
    text_config, `model.language_model.` names, a vision tower to skip, fused experts) is
    the same model. (Qwen3-Next's fused GDN projections: the parity tests load them.)"""
    src = oracle_by_name(name)
    _, ref = load_checkpoint(src, dtype=torch.float64)
    out = load_file(str(src / "model.safetensors"))
    text = json.loads((src / "config.json").read_text())
    out = {
        k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k: v
        for k, v in fuse_experts(out).items()
    }
    out["model.visual.patch_embed.proj.weight"] = torch.zeros(2, 2)
    raw = {"model_type": name, "text_config": text, "vision_config": {"depth": 1}}
    folder = tmp_path / "release"
    folder.mkdir()
    save_file(out, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(raw))
    cfg, got = load_checkpoint(folder, dtype=torch.float64)
    ids = torch.randint(3, cfg.vocab_size, (1, 20), generator=torch.Generator().manual_seed(0))
    assert torch.equal(got.forward_train(ids)[0], ref.forward_train(ids)[0])
