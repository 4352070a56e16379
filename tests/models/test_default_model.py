"""The shipped default model: transformers 5.17 loads it, and its logits match ours."""

import torch

from flashlane.config import DEFAULT_MODEL
from flashlane.models.loader import load_checkpoint


def test_transformers_loads_the_shipped_checkpoint_and_agrees():
    from transformers import AutoTokenizer, Qwen4ExpForCausalLM

    hf = Qwen4ExpForCausalLM.from_pretrained(DEFAULT_MODEL, dtype=torch.float32).eval()
    _, ours = load_checkpoint(DEFAULT_MODEL, dtype=torch.float64)
    tok = AutoTokenizer.from_pretrained(DEFAULT_MODEL)
    # past the 67-token dense zone of the indexer
    text = 'def walk(top):\n    """Directory tree generator."""\n' * 9
    ids = torch.tensor([tok(text)["input_ids"]])
    assert ids.shape[1] > 80
    with torch.no_grad():
        ref = hf(ids).logits[0].double()
        got = ours.forward_train(ids)[0][0].double()
    assert (got - ref).abs().max() <= 1e-4 * ref.abs().max()
    assert ours.mtp is not None
