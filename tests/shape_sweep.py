"""The shape sweep's checks on the CPU, for one config of tests/sweep_configs.py: our logits
against the transformers oracle, greedy continuations against the oracle's argmax, and
replies batched with other streams (drafted or not) against each alone undrafted.

Prompts are random ids with an EOS inside (the PLE n-grams restart) and one repetitive
prompt (copy drafts find matches); the longest crosses a prompt piece (C = 64) and has
complete blocks past the indexer's budget, so sparse selection runs.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from flashlane.lanes.records import CostTable
from flashlane.llm import LLM
from flashlane.request import SamplingParams
from tests.oracle import build_oracle, hf_classes, lower_id_ties

TOL = 1e-4  # of the largest |logit|, as the parity tests
COSTS = CostTable({1: 1.0, 2: 1.05, 4: 1.1, 8: 1.2, 16: 1.4}, draft_step_ms=0.3, overhead_ms=0.2)
PROMPT_LENGTHS = (130, 9, 33, 70)


@dataclasses.dataclass(frozen=True, slots=True)
class Sweep:
    """How much of each config the sweep checks (CI's short run, or the slow full one)."""

    num_tokens: int  # tokens a reply runs to
    parallel: int  # sessions of the batched engine, and prompts sent together


SHORT = Sweep(num_tokens=24, parallel=8)
FULL = Sweep(num_tokens=40, parallel=12)


def describe(spec: dict) -> str:
    """A test id: the fields the sweep varies most."""
    kinds = "".join("L" if t == "linear_attention" else "S" for t in spec["layer_types"])
    family = {"qwen3_next": "q3n-", "qwen3_5_moe_text": "q35moe-", "qwen3_5_text": "q35-"}
    experts = ""
    if "num_experts" in spec:
        experts = f"-e{spec['num_experts']}k{spec['num_experts_per_tok']}"
    return (
        f"{family.get(spec.get('model_type'), '')}{kinds}-hc{spec.get('hc_count', 1)}"
        f"-h{spec['hidden_size']}-kv{spec['linear_key_head_dim']}"
        f"x{spec['linear_value_head_dim']}{experts}"
        f"-v{spec['vocab_size']}-mtp{spec['mtp_num_hidden_layers']}"
    )


def prompts(spec: dict, count: int, seed: int) -> list[list[int]]:
    """`count` prompts of ids >= 3: random ones with an EOS inside, and a repetitive one."""
    g = torch.Generator().manual_seed(seed)
    eos, vocab = spec["eos_token_id"], spec["vocab_size"]
    out = []
    for i in range(count):
        n = PROMPT_LENGTHS[i % len(PROMPT_LENGTHS)] + i
        ids = torch.randint(3, vocab, (n,), generator=g)
        ids[n // 2] = eos
        out.append(ids.tolist())
    out[-1] = [5, 6, 7, 8, 9, 10] * 8
    return out


def build(folder: Path, spec: dict, seed: int, sweep: Sweep):
    """The randomised checkpoint, the transformers oracle on it and our engine on it."""
    build_oracle(folder, spec, seed=seed)
    model_class, _ = hf_classes(spec.get("model_type", "qwen4_exp_text"))
    oracle = model_class.from_pretrained(folder, dtype=torch.float32).eval()
    llm = LLM(str(folder), costs=COSTS, parallel=sweep.parallel, max_rows=16)
    return oracle, llm


def check(folder: Path, spec: dict, seed: int, sweep: Sweep) -> int:
    """Every check on one config; returns the tokens drafted in its batched runs."""
    oracle, llm = build(folder, spec, seed, sweep)
    ps = prompts(spec, sweep.parallel, seed)
    check_oracle(oracle, llm, ps[0], sweep.num_tokens)
    return check_batched(llm, ps, sweep.num_tokens)


def check_oracle(oracle, llm: LLM, prompt: list[int], num_tokens: int) -> None:
    """Our greedy reply; then, teacher-forced over prompt + reply, our logits within TOL of
    the oracle's, and each reply token the oracle's argmax (ties to the lower id), or within
    TOL of it where the oracle's own top two are closer than that."""
    greedy = SamplingParams(max_tokens=num_tokens, temperature=0.0, ignore_eos=True, draft=False)
    reply = llm.generate(prompt, greedy)[0].token_ids
    assert len(reply) == num_tokens
    ids = prompt + reply
    with torch.no_grad(), lower_id_ties():
        ref = oracle(torch.tensor([ids])).logits[0].double()
    ours = llm.logits(ids).double()
    scale = ref.abs().max().item()
    err = (ours - ref).abs().max().item()
    assert err <= TOL * scale, f"logits: max error {err:.3g}, {err / scale:.3g} of the largest"
    steps = ref[len(prompt) - 1 : -1]
    for i, (row, token) in enumerate(zip(steps, reply)):
        top2 = row.topk(2).values
        if top2[0] - top2[1] > TOL * scale:
            assert token == int(row.argmax()), f"greedy token {i}: {token}, oracle {row.argmax()}"
        else:
            assert row[token] >= top2[0] - TOL * scale, f"greedy token {i}: {token}"


def check_batched(llm: LLM, ps: list[list[int]], num_tokens: int) -> int:
    """Greedy and seeded (top_p): the prompts together, every other one drafting, against
    each alone undrafted, token for token. Returns the tokens drafted."""
    drafted = 0
    for params in (
        SamplingParams(max_tokens=num_tokens, temperature=0.0, ignore_eos=True),
        SamplingParams(max_tokens=num_tokens, temperature=0.9, top_p=0.95, seed=11),
    ):
        mixed = [dataclasses.replace(params, draft=(i % 2 == 0)) for i in range(len(ps))]
        together = llm.generate(ps, mixed)
        for i, (prompt, got) in enumerate(zip(ps, together)):
            alone = llm.generate(prompt, dataclasses.replace(params, draft=False))[0]
            assert got.error is None and alone.error is None
            assert got.token_ids == alone.token_ids, (params.temperature, i)
            drafted += got.stats.drafted
    return drafted
