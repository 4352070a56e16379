"""The model card (README.md) of a trained checkpoint, written from its run record.

python -m training.model_card flashlane/default_model   # re-render from train_log.json
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

from flashlane.models.census import count_params
from flashlane.models.config import ModelConfig

PARTS = ("embeddings", "lm_head", "gdn", "attention", "experts", "shared_expert", "router",
         "hyper_connections", "ple", "ngram_table", "final_mixer", "mtp")  # fmt: skip
CONFIG_KEYS = ("hidden_size", "num_hidden_layers", "layer_types", "num_attention_heads",
               "num_key_value_heads", "head_dim", "linear_num_key_heads",
               "linear_num_value_heads", "linear_key_head_dim", "num_experts",
               "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
               "hc_count", "hc_lowrank", "ple_layer_ids", "ple_embed_dim", "heads_per_ngram",
               "ngram_vocab_size_base", "indexer_n_heads", "indexer_head_dim", "indexer_budget",
               "indexer_compress_ratio", "max_position_embeddings", "vocab_size")  # fmt: skip


def _table(header: tuple[str, ...], rows: list[tuple]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def _log_rows(log: list[dict], max_rows: int = 16) -> list[tuple]:
    log = [e for e in log if "main" in e]
    stride = max(1, len(log) // max_rows)
    picked = [e for i, e in enumerate(log) if i % stride == 0 or i == len(log) - 1]
    return [(e["step"], e["main"], e["mtp"], e["lr"], e["tokens"], e["tokens_per_s"],
             e["seconds"]) for e in picked]  # fmt: skip


def _heldout_rows(log: list[dict]) -> list[str]:
    """The held-out evaluations during training (fp32 weights, all held-out windows)."""
    evals = [(e["step"], e["heldout_main"], e["heldout_mtp"], e["accept1"])
             for e in log if "heldout_main" in e]  # fmt: skip
    if not evals:
        return []
    header = ("step", "held-out main", "held-out MTP", "depth-1 acceptance")
    return ["Held-out evaluations during the run:", "", *_table(header, evals), ""]


def render(config: dict, run: dict, num_params: int, checkpoint_bytes: int) -> str:
    cfg = ModelConfig.from_hf(config)
    counts = count_params(cfg)
    summary, heldout, manifest = run["summary"], run["heldout"], run["manifest"]
    p = run["config"]
    if "indexer_weight" in p:
        indexer_term = (f" + {p['indexer_weight']} * (the QSA indexer's KL to dense attention +"
                        " a hinge keeping its per-head scores above a margin; both reach only the"
                        " indexer, `training/aux_losses.py`)")  # fmt: skip
        indexer_note = ("The indexer is trained by distillation from dense attention; its"
                        " scores are kept positive, so block selection has no exact ties and"
                        " transformers picks the same blocks.")  # fmt: skip
    else:
        indexer_term = ""
        indexer_note = ("This run predates the indexer loss: the QSA indexer kept its random"
                        " init (no gradient reaches a top-k), selection is arbitrary, and relu"
                        " scores tie at 0, where transformers' topk picks other blocks than"
                        " ours, so its logits differ past 67 tokens.")  # fmt: skip
    early = (" (the time limit stopped it before the schedule's end, so a rerun gives the"
             " same weights only where it reaches the same step)" if summary["stopped_early"]
             else "")  # fmt: skip
    lines = [
        "# flashlane default model: a tiny Flash Next (qwen4_exp) with an MTP head",
        "",
        "The checkpoint `flashlane` serves when no `--model` is given (`LLM(model=None)`,",
        "`flashlane serve`, `flashlane generate`). It is small and trained for minutes on the",
        "Python standard library, so it writes Python-looking text and docstrings; it is not an",
        "assistant. It exists so that serving, drafting and the benchmarks run on every machine",
        "without a download, with real text and real MTP acceptance, through every part of the",
        "architecture: hyper-connections, PLE, Gated DeltaNet, QSA sparse attention (active past",
        f"{cfg.indexer_budget + cfg.indexer_block - 1} tokens), MoE with a shared expert, MTP.",
        "",
        "## Files",
        "",
        "- `config.json`: transformers 5.17 `qwen4_exp_text` (`Qwen4ExpForCausalLM` loads it;",
        "  it drops the `mtp.*` tensors, flashlane keeps them).",
        f"- `model.safetensors`: {num_params:,} parameters stored in **bf16** "
        f"({checkpoint_bytes / 1e6:.1f} MB); trained in fp32.",
        f"- `tokenizer.json`: byte-level BPE, {cfg.vocab_size} ids (Qwen3.5's pre-tokenizer,"
        " newlines split from punctuation),",
        "  trained by `training/tokenizer.py` on",
        f"  {run['tokenizer_corpus']};",
        "  ids 0-8: `<|endoftext|>` (EOS), `<|im_start|>`, `<|im_end|>`, `<think>`, `</think>`,",
        "  `<tool_call>`, `</tool_call>`, `<tool_response>`, `</tool_response>`.",
        "- `tokenizer_config.json`, `chat_template.jinja`: Qwen3.5-style ChatML; the template",
        "  opens a think block by default (`chat_template_kwargs: {\"enable_thinking\": false}`",
        "  closes an empty one); tools go in the system prompt, calls in Qwen3-Coder XML",
        "  (`<function=..>`). flashlane serves this model with `enable_thinking: false` unless a",
        "  request (or `--default-chat-template-kwargs`) says otherwise: it was trained on code,",
        "  not on reasoning traces, and never closes a block it opens.",
        "- `generation_config.json`: stops on `<|im_end|>` and `<|endoftext|>`; `max_new_tokens`",
        "  256 is the reply budget of a request without `max_tokens` (the model seldom ends one).",
        "- `corpus_manifest.json`: every file of this run's corpus (path, size, sha256, split);",
        "  `tokenizer_corpus.json`: the corpus summary the tokenizer was trained on.",
        "- `train_log.json`: the run: command, seed, preset, every logged loss, evaluation.",
        "",
        "## Architecture",
        "",
        *_table(("key", "value"), [(k, json.dumps(config[k])) for k in CONFIG_KEYS]),
        "",
        *_table(("part", "parameters"), [(k, f"{getattr(counts, k):,}") for k in PARTS]),
        "",
        "## Corpus",
        "",
        f"The `*.py` files of the Python {manifest['python']} standard library (sources,",
        "comments and docstrings) without test suites, site-packages, generated codec tables or",
        "machine-specific files; documents joined with `<|endoftext|>`. Held out by file:",
        f"`{manifest['heldout_rule']}`.",
        "",
        *_table(("split", "files", "bytes", "tokens"), [
            ("train", manifest["splits"]["train"]["num_files"],
             f"{manifest['splits']['train']['num_bytes']:,}", f"{run['train_tokens']:,}"),
            ("held out", manifest["splits"]["heldout"]["num_files"],
             f"{manifest['splits']['heldout']['num_bytes']:,}", f"{run['heldout_tokens']:,}"),
        ]),
        "",
        "## Training",
        "",
        "```",
        run["command"],
        "```",
        "",
        textwrap.fill(
            f"Seed {run['seed']}, preset `{run['preset']}` on {run['device']}, torch "
            f"{run['torch']}, Python {run['python']}. Loss = CE(main, x_t+1) + "
            f"{p['mtp_weight']} * CE(MTP, x_t+2) + {p['balance_weight']} * router balance"
            f"{indexer_term}. "
            f"AdamW (0.9, 0.95), peak lr {p['lr']}, {p['warmup']} warmup steps then cosine to "
            f"{p['min_lr_ratio']} x peak, weight decay {p['weight_decay']} on matrices, clip "
            f"{p['grad_clip']}; batches of {p['batch_size']} x {p['seq_len']} tokens. "
            f"{summary['steps']} steps{early}, {summary['tokens']:,} tokens in "
            f"{summary['seconds']} s ({summary['tokens_per_s']:,} tokens/s).", width=92),
        "",
        *_table(("step", "main", "mtp", "lr", "tokens", "tokens/s", "seconds"),
                _log_rows(run["log"])),
        "",
        *_heldout_rows(run["log"]),
        "## Results (teacher forced, the bf16 weights as shipped)",
        "",
        *_table(("", "main head", "MTP head"), [
            ("train loss (last log interval)", summary["train_main"], summary["train_mtp"]),
            ("held-out loss", heldout["main_loss"], heldout["mtp_loss"]),
            ("held-out top-1", heldout["main_top1"], heldout["mtp_top1"]),
        ]),
        "",
        "MTP acceptance at depth 1 (MTP argmax at cell t == main argmax at t+1, over",
        f"{heldout['num_tokens']:,} held-out positions): **{heldout['mtp_accept_depth1']}**.",
        "",
        textwrap.fill(indexer_note, width=92),
        "",
        "Depths 2..4 need the engine's chained drafts (`training/evaluate.py`,",
        "`chained_acceptance`); they are not measured yet.",
        "",
        "## Reproduce",
        "",
        "```",
        "python -m training.tokenizer --out flashlane/default_model   # the tokenizer files",
        run["command"],
        "python -m training.evaluate --model flashlane/default_model",
        "```",
        "",
        "Same interpreter (the corpus is its stdlib), torch and device give the same losses.",
        "",
    ]  # fmt: skip
    return "\n".join(lines)


def write(out_dir: Path) -> None:
    """Render out_dir/README.md from the folder's config.json, train_log.json and manifests."""
    config = json.loads((out_dir / "config.json").read_text())
    run = json.loads((out_dir / "train_log.json").read_text())
    manifest = json.loads((out_dir / "corpus_manifest.json").read_text())
    manifest.pop("files")
    tok_corpus = out_dir / "tokenizer_corpus.json"
    if tok_corpus.exists():
        t = json.loads(tok_corpus.read_text())
        run["tokenizer_corpus"] = (f"the train split of the Python {t['python']} stdlib "
                                   f"({t['splits']['train']['num_files']} files)")  # fmt: skip
    else:
        run["tokenizer_corpus"] = "the train split of the corpus below"
    num_params = count_params(ModelConfig.from_hf(config)).loaded
    size = (out_dir / "model.safetensors").stat().st_size
    (out_dir / "README.md").write_text(
        render(config, {**run, "manifest": manifest}, num_params, size)
    )


if __name__ == "__main__":
    write(Path(sys.argv[1]))
