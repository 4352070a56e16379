"""The peers of `flashlane bench model`. transformers: the same random weights (regenerated
after ours is freed, since two copies do not fit), `generate` greedy, fla-core used by
transformers where it is installed.

Decode tok/s = N x T / (the time from the first new token's logits to the last's), batch N,
read by a logits processor that syncs the device at each step (a long prefill stays outside
the interval); prefill tok/s = length / time of one new token.

llama.cpp: a build of ours (flashlane.llama_cpp) on the GGUF of the same checkpoint, its own
llama-batched-bench (decode, S_TG) and llama-bench (prefill, pp); flashlane/llama_cpp/tools.py
says how each figure matches ours.
"""

from __future__ import annotations

import gc
import importlib.util
import time

import torch

from flashlane.bench.common import sync
from flashlane.models.random_weights import fill_transformers, transformers_classes


def _timed_generate(model, ids: torch.Tensor, new: int) -> float:
    sync(ids.device)
    t = time.perf_counter()
    model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
    sync(ids.device)
    return time.perf_counter() - t


class StepClock:
    """A logits processor that timestamps each generation step (after a device sync)."""

    def __init__(self):
        self.times: list[float] = []

    def __call__(self, input_ids, scores):
        sync(scores.device)
        self.times.append(time.perf_counter())
        return scores


def _decode_seconds(model, ids: torch.Tensor, new: int) -> float:
    """Seconds of the last `new` steps of a greedy generate of new + 1 tokens."""
    from transformers import LogitsProcessorList

    clock = StepClock()
    model.generate(
        ids,
        max_new_tokens=new + 1,
        min_new_tokens=new + 1,
        do_sample=False,
        pad_token_id=0,
        logits_processor=LogitsProcessorList([clock]),
    )
    return clock.times[-1] - clock.times[0]


def run_transformers(raw: dict, args) -> dict:
    import transformers

    # the family's own class (Flash Next unless the config names a sibling); no MTP head
    model_class, config_class = transformers_classes(raw.get("model_type", "qwen4_exp_text"))
    spec = {k: v for k, v in raw.items() if k not in ("model_type", "mtp_num_hidden_layers")}
    if model_class is transformers.Qwen4ExpForCausalLM:
        spec["mtp_num_hidden_layers"] = 0
    default = torch.get_default_dtype()
    cuda = torch.device(args.device).type == "cuda"
    torch.set_default_dtype(torch.bfloat16 if cuda else torch.float32)
    try:
        with torch.device(args.device):
            model = model_class(config_class(**spec)).eval()
    finally:
        torch.set_default_dtype(default)
    fill_transformers(model, args.seed)
    out = {
        "transformers": transformers.__version__,
        "model": type(model).__name__,
        "fla": importlib.util.find_spec("fla") is not None,
        "experts_implementation": getattr(model.config, "_experts_implementation", None),
        "decode": {},
        "prefill": {},
    }
    vocab, t = raw["vocab_size"], args.decode_tokens
    g = torch.Generator().manual_seed(args.seed)
    with torch.no_grad():
        warm = torch.randint(3, vocab, (1, args.prompt_len), generator=g).to(args.device)
        _timed_generate(model, warm, 4)
        for n in args.streams:
            ids = torch.randint(3, vocab, (n, args.prompt_len), generator=g).to(args.device)
            _timed_generate(model, ids, 2)  # this batch's shapes compiled / tuned first
            secs = _decode_seconds(model, ids, t)
            out["decode"][n] = {"tok_s": n * t / secs, "round_ms": 1e3 * secs / t}
        for length in args.peer_prefill:
            ids = torch.randint(3, vocab, (1, length), generator=g).to(args.device)
            try:
                secs = _timed_generate(model, ids, 1)
                out["prefill"][length] = {"tok_s": length / secs, "ttft_s": secs}
            except torch.OutOfMemoryError as err:
                out["prefill"][length] = {"error": str(err).splitlines()[0]}
                torch.cuda.empty_cache()
    del model
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return out


def run_llama_cpp(raw: dict, args) -> dict:
    """llama.cpp on the GGUF of the same random checkpoint (written here through its converter
    the first time, kept in --gguf-dir after): decode at each --streams, prefill at each
    --prefill. Its build, flags and commands go into the result."""
    from pathlib import Path

    from flashlane.llama_cpp import tools
    from flashlane.llama_cpp.build import find_build
    from flashlane.llama_cpp.write_gguf import write_gguf

    build = find_build(args.llama_cpp)
    if build.src is None:
        raise FileNotFoundError(
            f"{build.bin_dir}: no CMakeCache.txt naming its source (the converter comes from there)"
        )
    # a config.json's path names its GGUF by its folder; write_gguf's stamp tells them apart
    name = Path(args.config).parent.name if args.config.endswith(".json") else args.config
    gguf = Path(args.gguf_dir) / f"{name}-seed{args.seed}-bf16.gguf"
    t0 = time.perf_counter()
    wrote = write_gguf(gguf, build.src, raw, args.seed, args.device)
    gpu = torch.device(args.device).type == "cuda"
    out = {
        "name": "llama.cpp",
        "llama.cpp": build.build,
        "flags": build.flags,
        "gguf": str(gguf),
        "gguf_bytes": gguf.stat().st_size,
        "gguf_written_s": time.perf_counter() - t0 if wrote else None,
    }
    ran = tools.decode(
        build, gguf, args.streams, args.prompt_len, args.decode_tokens, gpu, args.llama_threads
    )
    out["decode"], out["decode_command"] = ran["decode"], ran["command"]
    ran = tools.prefill(build, gguf, args.prefill, gpu, args.llama_threads)
    out["prefill_command"] = ran.pop("command")
    out.update(ran)
    return out
