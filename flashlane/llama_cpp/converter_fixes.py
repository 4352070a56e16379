"""llama.cpp's converter (b11434) made to take our checkpoints, fixed from outside.

Each family goes through the converter's own text model (CONVERTERS) to its llama.cpp arch:
Flash Next to qwen4exp, Qwen3-Next to qwen3next, Qwen3.5 to qwen35, Qwen3.5-MoE to qwen35moe.
The siblings' converters keep the MTP head (`mtp.*` as block num_hidden_layers, its
`nextn.*` tensors) and llama.cpp loads it. What llama.cpp cannot hold is refused before
anything is written (`check_fits`).

Four things stop it on a Flash Next checkpoint of ours; none is fixed by editing its files:
- it marks a layer sparse (QSA) only when `layer_types` says `full_attention`, while ours and
  transformers' say `qwen_sparse_attention`: such a GGUF loads as dense and aborts at warm-up
  (`GGML_ASSERT(buffer)`). The config it reads goes through transformers' AutoConfig, which
  names them `qwen_sparse_attention` again, so `fixed_model_class` renames them after that.
- `Qwen3_5Tokenizer`, the class our tokenizer_config.json names, is unknown to the transformers
  the converter pins; the tokenizer is a plain fast tokenizer (`tokenizer_folder`).
- the embedded tokenizer's pre-tokenizer hash is not in its table; `qwen35`'s pre-tokenizer
  splits text into the same ids, so an unknown hash falls back to it (`fixed_model_class`).
- llama.cpp sizes the PLE projections by the hidden size: that one is C++, see build.PLE_FIX.
"""

from __future__ import annotations

import importlib
import json
import logging
import shutil
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from flashlane.models.config import ModelConfig

log = logging.getLogger(__name__)
SPARSE = {"qwen_sparse_attention": "full_attention"}
# family -> (the converter's module, its text model class, the architecture its config names)
CONVERTERS = {
    "flashnext": ("qwen4exp", "Qwen4ExpTextModel", "Qwen4ExpForCausalLM"),
    "qwen3_next": ("qwen", "Qwen3NextModel", "Qwen3NextForCausalLM"),
    "qwen3_5": ("qwen", "Qwen3_5TextModel", "Qwen3_5ForCausalLM"),
    "qwen3_5_moe": ("qwen", "Qwen3_5MoeTextModel", "Qwen3_5MoeForCausalLM"),
}
# the MoE keys a dense Qwen3.5 preset inherits from the MoE one; its checkpoints have none,
# and the converter would write them as an expert count of a dense model
MOE_KEYS = (
    "num_experts", "num_experts_per_tok", "moe_intermediate_size",
    "shared_expert_intermediate_size", "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers",
)  # fmt: skip


def load_converter(src: Path):
    """llama.cpp's `conversion` package from the source tree `src` (its own gguf-py first on
    the path: the GPU machine has no gguf package, and a different one would not match)."""
    for path in (src / "gguf-py", src):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    if not (src / "conversion" / "qwen4exp.py").is_file():
        raise FileNotFoundError(f"{src}: no conversion/qwen4exp.py (not llama.cpp b11434?)")
    return importlib.import_module("conversion")


def check_fits(cfg: ModelConfig) -> None:
    """A ValueError naming what llama.cpp's arch of cfg's family cannot hold: qwen3next and
    qwen35moe build every layer with the MoE (no dense `mlp_only_layers`), and the siblings'
    arches size GDN keys and values by one head width (ssm.state_size)."""
    if cfg.family == "flashnext":
        return
    if cfg.family != "qwen3_5" and cfg.dense_mlp_layers:
        raise ValueError(
            f"llama.cpp's {cfg.family} model has the MoE in every layer: this config's layers "
            f"{list(cfg.dense_mlp_layers)} are dense (mlp_only_layers); no GGUF for it"
        )
    if cfg.linear_k_head_dim != cfg.linear_v_head_dim:
        raise ValueError(
            f"llama.cpp sizes GDN keys and values alike: linear_key_head_dim "
            f"{cfg.linear_k_head_dim} != linear_value_head_dim {cfg.linear_v_head_dim}"
        )


def converter_config(raw: Mapping) -> dict:
    """Our config.json with the architecture of its family the converter registers (presets
    name none), checked against llama.cpp (check_fits); a dense Qwen3.5's without MOE_KEYS."""
    cfg = ModelConfig.from_hf(dict(raw))
    check_fits(cfg)
    out = dict(raw)
    if cfg.family == "qwen3_5":
        out = {k: v for k, v in out.items() if k not in MOE_KEYS}
    out["architectures"] = [CONVERTERS[cfg.family][2]]
    return out


def tokenizer_folder(tokenizer: Path, dst: Path) -> None:
    """tokenizer.json and a tokenizer_config.json naming the fast tokenizer, in dst."""
    shutil.copyfile(tokenizer / "tokenizer.json", dst / "tokenizer.json")
    cfg = json.loads((tokenizer / "tokenizer_config.json").read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    (dst / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1))


def fixed_model_class(
    conversion, tensors: Mapping[str, tuple] | None = None, cfg: ModelConfig | None = None
):
    """The converter's text model of cfg's family (Flash Next's without cfg) with the
    pre-tokenizer fallback; with `tensors` (checkpoint name -> (shape, dtype, make: () -> CPU
    tensor)) its tensors come from those makers, lazily, one at a time as the writer reaches
    them, instead of a safetensors file."""
    from conversion.base import LazyTorchTensor

    module, class_name, _ = CONVERTERS[cfg.family if cfg else "flashnext"]
    base = getattr(importlib.import_module(f"conversion.{module}"), class_name)

    class Fixed(base):
        model_arch = base.model_arch
        # no MTP head: the Qwen mixin would otherwise insist on counting its layers
        no_mtp = base.no_mtp or (cfg is not None and cfg.num_mtp_layers == 0)

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.hparams["layer_types"] = [SPARSE.get(t, t) for t in self.hparams["layer_types"]]

        def get_vocab_base_pre(self, tokenizer) -> str:
            try:
                return super().get_vocab_base_pre(tokenizer)
            except NotImplementedError:
                log.warning("unknown pre-tokenizer hash: writing qwen35 (it splits the same ids)")
                return "qwen35"

        def index_tensors(self, remote_hf_model_id=None) -> dict[str, Callable]:
            if tensors is None:
                return super().index_tensors(remote_hf_model_id)
            # what the MTP mixin's index_tensors records before it reads the files
            cls = type(self)
            cls._original_block_count = self.hparams["num_hidden_layers"]
            cls.opt_num_mtp_layers = 0
            out = {}
            for name, (shape, dtype, make) in tensors.items():
                meta = LazyTorchTensor.meta_with_dtype_and_shape(dtype, tuple(shape))

                def gen(meta=meta, make=make):
                    return LazyTorchTensor(meta=meta, args=(), func=make)

                if (item := self.filter_tensors((name, gen))) is not None:
                    out[item[0]] = item[1]
            return out

    Fixed.__name__ = Fixed.__qualname__ = f"Fixed{class_name}"
    return Fixed


def convert(src: Path, folder: Path, out: Path, tensors: Mapping[str, tuple] | None) -> None:
    """Write the GGUF (bf16 weights) of the checkpoint folder `folder` (config.json, the
    tokenizer, and model.safetensors unless `tensors` is given) to `out`."""
    conversion = load_converter(src)
    import gguf  # llama.cpp's own, put on the path by load_converter

    cfg = ModelConfig.from_hf(folder / "config.json")
    cls = fixed_model_class(conversion, tensors, cfg)
    with torch.inference_mode():
        model = cls(folder, gguf.LlamaFileType.MOSTLY_BF16, out)
        # its progress bar would fill a log with carriage returns; write_gguf prints its own
        tensors_to_file = model.gguf_writer.write_tensors_to_file
        model.gguf_writer.write_tensors_to_file = lambda **_: tensors_to_file(progress=False)
        model.write()
