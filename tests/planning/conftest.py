"""The published Flash Next config, planned by test_memory.py and test_shorter.py."""

import json

import pytest

from flashlane.models.config import ModelConfig
from tests import DATA


@pytest.fixture(scope="module")
def real() -> ModelConfig:
    return ModelConfig.from_hf(json.loads((DATA / "flashnext_real_config.json").read_text()))
