"""llama.cpp's converter (b11434) made to take our checkpoints, fixed from outside.

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

log = logging.getLogger(__name__)
SPARSE = {"qwen_sparse_attention": "full_attention"}
ARCHITECTURE = "Qwen4ExpForCausalLM"


def load_converter(src: Path):
    """llama.cpp's `conversion` package from the source tree `src` (its own gguf-py first on
    the path: the GPU machine has no gguf package, and a different one would not match)."""
    for path in (src / "gguf-py", src):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    if not (src / "conversion" / "qwen4exp.py").is_file():
        raise FileNotFoundError(f"{src}: no conversion/qwen4exp.py (not llama.cpp b11434?)")
    return importlib.import_module("conversion")


def converter_config(raw: Mapping) -> dict:
    """Our config.json with an architecture the converter registers (presets name none)."""
    out = dict(raw)
    out["architectures"] = [ARCHITECTURE]
    return out


def tokenizer_folder(tokenizer: Path, dst: Path) -> None:
    """tokenizer.json and a tokenizer_config.json naming the fast tokenizer, in dst."""
    shutil.copyfile(tokenizer / "tokenizer.json", dst / "tokenizer.json")
    cfg = json.loads((tokenizer / "tokenizer_config.json").read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    (dst / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1))


def fixed_model_class(conversion, tensors: Mapping[str, tuple] | None = None):
    """The converter's Qwen4Exp text model with the pre-tokenizer fallback; with `tensors`
    (checkpoint name -> (shape, dtype, make: () -> CPU tensor)) its tensors come from those
    makers, lazily, one at a time as the writer reaches them, instead of a safetensors file."""
    from conversion.base import LazyTorchTensor
    from conversion.qwen4exp import Qwen4ExpTextModel

    class FixedQwen4Exp(Qwen4ExpTextModel):
        model_arch = Qwen4ExpTextModel.model_arch

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

    return FixedQwen4Exp


def convert(src: Path, folder: Path, out: Path, tensors: Mapping[str, tuple] | None) -> None:
    """Write the GGUF (bf16 weights) of the checkpoint folder `folder` (config.json, the
    tokenizer, and model.safetensors unless `tensors` is given) to `out`."""
    conversion = load_converter(src)
    import gguf  # llama.cpp's own, put on the path by load_converter

    cls = fixed_model_class(conversion, tensors)
    with torch.inference_mode():
        model = cls(folder, gguf.LlamaFileType.MOSTLY_BF16, out)
        # its progress bar would fill a log with carriage returns; write_gguf prints its own
        tensors_to_file = model.gguf_writer.write_tensors_to_file
        model.gguf_writer.write_tensors_to_file = lambda **_: tensors_to_file(progress=False)
        model.write()
