"""The embedded model's tokenizer: byte-level BPE (HF `tokenizers`) trained on the corpus.

The pipeline is Qwen3.5's (NFC, its split regex, byte-level bytes, byte-level decoder), so
transformers' `Qwen3_5Tokenizer` and plain `tokenizers.Tokenizer.from_file` read the same
tokenizer.json and give the same ids. Special tokens take the first ids; the reasoning and
tool tags are "added, not special" as in Qwen3.5, so decoding with skip_special_tokens keeps
them for the server's reasoning and tool-call parsers.

    python -m training.tokenizer --out flashlane/default_model
writes tokenizer.json, tokenizer_config.json (with the chat template), chat_template.jinja,
generation_config.json and tokenizer_corpus.json (the corpus summary it was trained on).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    trainers,
)

from training import corpus

VOCAB_SIZE = 8192
# (content, is_special): ids are the list order, so EOS is id 0.
SPECIAL_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<think>", False),
    ("</think>", False),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
)
EOS, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
# Qwen3.5's pre-tokenizer split (transformers models/qwen3_5/tokenization_qwen3_5.py), except
# that a punctuation run never takes the newlines after it: with Qwen's rule "):\n" is one
# pre-token, so a prompt that ends in "):" ends on a token the model has almost never seen
# (greedy "def fibonacci(n):" derailed); here "):" and "\n" are always separate.
SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+|\s*[\r\n]+|\s+(?!\S)|\s+"
)
TEMPLATE_PATH = Path(__file__).with_name("chat_template.jinja")
# max_new_tokens: the reply budget of a request without max_tokens (vLLM reads it so too);
# the small model seldom ends a reply, so a chat without max_tokens comes back in seconds
GENERATION_DEFAULTS = {
    "do_sample": True,
    "temperature": 0.7,
    "top_p": 0.95,
    "top_k": 20,
    "max_new_tokens": 256,
}


def _empty_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE(fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def train_tokenizer(docs: Sequence[str], vocab_size: int = VOCAB_SIZE) -> Tokenizer:
    """Train on `docs` (the train split); ids 0..len(SPECIAL_TOKENS)-1 are the special tokens."""
    tok = _empty_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=[
            AddedToken(text, special=special, normalized=False) for text, special in SPECIAL_TOKENS
        ],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(docs, trainer=trainer, length=len(docs))
    # The trainer registers every token it is given as special; restore Qwen's flags.
    spec = json.loads(tok.to_str())
    flags = dict(SPECIAL_TOKENS)
    for added in spec["added_tokens"]:
        added["special"] = flags[added["content"]]
    tok = Tokenizer.from_str(json.dumps(spec))
    check_special_ids(tok)
    return tok


def check_special_ids(tok: Tokenizer) -> None:
    """Every special token sits at its fixed id and encodes to exactly that one id."""
    for want, (text, _) in enumerate(SPECIAL_TOKENS):
        got = tok.token_to_id(text)
        if got != want or tok.encode(text).ids != [want]:
            raise ValueError(f"special token {text!r} has id {got}, expected {want}")


def special_id(text: str) -> int:
    return [t for t, _ in SPECIAL_TOKENS].index(text)


def chat_template() -> str:
    return TEMPLATE_PATH.read_text()


def tokenizer_config(max_length: int) -> dict:
    """tokenizer_config.json in the transformers 5 layout (the template is also a .jinja file)."""
    return {
        "tokenizer_class": "Qwen3_5Tokenizer",
        "add_prefix_space": False,
        "bos_token": None,
        "eos_token": EOS,
        "pad_token": EOS,
        "unk_token": None,
        "errors": "replace",
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "model_max_length": max_length,
        "added_tokens_decoder": {
            str(i): {
                "content": text,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": special,
            }
            for i, (text, special) in enumerate(SPECIAL_TOKENS)
        },
        "chat_template": chat_template(),
    }


def generation_config() -> dict:
    """Sampling defaults the server fills in; generation stops on <|im_end|> or <|endoftext|>."""
    return {
        "eos_token_id": [special_id(IM_END), special_id(EOS)],
        "pad_token_id": special_id(EOS),
        **GENERATION_DEFAULTS,
    }


def save(tok: Tokenizer, out_dir: Path, max_length: int = 32_768) -> None:
    """Write tokenizer.json, tokenizer_config.json, chat_template.jinja, generation_config.json."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    files = {
        "tokenizer_config.json": tokenizer_config(max_length),
        "generation_config.json": generation_config(),
    }
    for name, body in files.items():
        (out_dir / name).write_text(json.dumps(body, indent=2, ensure_ascii=False) + "\n")
    (out_dir / "chat_template.jinja").write_text(chat_template())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder to write the files into")
    parser.add_argument("--vocab-size", type=int, default=VOCAB_SIZE)
    parser.add_argument("--max-length", type=int, default=32_768, help="model_max_length")
    args = parser.parse_args()
    t0 = time.perf_counter()
    files = corpus.list_files()
    docs = list(corpus.read_documents([f for f in files if f.split == "train"]))
    tok = train_tokenizer(docs, args.vocab_size)
    save(tok, args.out, args.max_length)
    # Which corpus the tokenizer saw (a training run may later read another Python's stdlib).
    manifest = corpus.write_manifest(files, args.out / "tokenizer_corpus.json")
    manifest.pop("files")
    (args.out / "tokenizer_corpus.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(
        json.dumps(
            {
                "vocab_size": tok.get_vocab_size(),
                "train_files": len(docs),
                "seconds": round(time.perf_counter() - t0, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
