"""A rank's weights and memory plan under tensor parallel (`flashlane info -tp N`)."""

from __future__ import annotations

import json

from flashlane.cli import main
from flashlane.models.census import count_params
from flashlane.models.config import ModelConfig
from flashlane.models.presets import config_dict
from flashlane.parallel.footprint import rank_params


def test_one_rank_holds_what_the_census_loads_and_more_ranks_less():
    cfg = ModelConfig.from_hf(config_dict("flashnext-48l"))
    counts = count_params(cfg)
    assert rank_params(cfg, 1) == counts.loaded
    assert rank_params(cfg, 1, table=False) == counts.loaded - counts.ngram_table
    two, four = rank_params(cfg, 2, table=False), rank_params(cfg, 4, table=False)
    # experts dominate and split: each doubling of ranks about halves a rank's weights
    assert 0.45 < four / two < 0.55


def test_info_plans_one_rank(tmp_path, capsys, monkeypatch):
    from flashlane.planning import memory

    # the 4-GPU host's 512 GiB: each rank's copy of the table is planned in host memory
    monkeypatch.setattr(memory, "read_ram_bytes", lambda: 512 * 2**30)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(config_dict("flashnext-48l")))
    assert main(["info", str(config), "--tensor-parallel-size", "4", "--context", "65536"]) == 0
    out = capsys.readouterr().out
    assert "one rank's of 4" in out
    weights = next(line for line in out.splitlines() if line.strip().startswith("weights"))
    assert 55 < float(weights.split()[1]) < 70  # GiB of bf16 on each of 4 GPUs (table on host)
