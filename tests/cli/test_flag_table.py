"""The engine flags come from EngineConfig's fields: every field has a flag (or says why it
has none), and each flag, given on the command line, reaches its field through
engine_options and EngineConfig.resolve."""

from __future__ import annotations

from dataclasses import fields

import pytest

from flashlane.cli import build_parser
from flashlane.config import ENVIRONMENT, EngineConfig
from flashlane.flags import engine_options
from flashlane.options import flag_name, flag_of, from_env, internal, is_switch

# a value other than the default for each field with a flag, as typed on the command line
# (text) and as the field then holds it; a new field needs a line here
GIVEN = {
    "model": ("some/dir", "some/dir"),
    "device": ("cpu", "cpu"),
    "dtype": ("float32", "float32"),
    "ple_table_device": ("cpu", "cpu"),
    "ple_table_dtype": ("int8", "int8"),
    "quantization": ("fp8", "fp8"),
    "kv_cache_dtype": ("fp8", "fp8"),
    "parallel": ("3", 3),
    "context": ("4096", 4096),
    "slot_contexts": ("2048,1024x2", "2048,1024x2"),
    "slot_grow": ("512", 512),
    "memory_limit_gb": ("2.5", 2.5),
    "gpu_memory_utilization": ("0.5", 0.5),
    "max_rows": ("8", 8),
    "max_queue": ("9", 9),
    "drafts": (None, False),
    "mtp_drafts": ("2", 2),
    "mtp_confidence": ("0.25", 0.25),
    "prompt_cache_gb": ("0.5", 0.5),
    "chat_template": ("{{ x }}", "{{ x }}"),
    "default_chat_template_kwargs": ('{"a": 1}', {"a": 1}),
    "unpriced": (None, True),
    "lone": (None, False),
    "lone_streams": ("2", 2),
    "lone_sampled": (None, False),
    "lone_post": (None, False),
    "graphs": (None, False),
    "kernels": ("reference", "reference"),
    "seed": ("7", 7),
    "tensor_parallel_size": ("2", 2),
    "expert_parallel": (None, True),
}


def test_every_field_has_a_flag_or_says_it_is_internal():
    for f in fields(EngineConfig):
        marked = [k for k in ("flag", "internal") if k in f.metadata]
        assert len(marked) == 1, f"EngineConfig.{f.name}: give it option(...) or internal(...)"
        if "internal" in f.metadata:
            assert f.metadata["internal"].strip(), f"EngineConfig.{f.name}: say why"
    flagged = {f.name for f in fields(EngineConfig) if flag_of(f) is not None}
    assert flagged == set(GIVEN)


def test_internal_marks_a_field_without_a_flag():
    f = internal(None, "set by tests only")
    assert f.metadata == {"internal": "set by tests only"} and f.default is None


@pytest.mark.parametrize("name", sorted(GIVEN))
def test_each_flag_reaches_its_field(name):
    f = next(f for f in fields(EngineConfig) if f.name == name)
    text, want = GIVEN[name]
    assert want != f.default
    argv = ["serve", flag_name(f)] + ([] if is_switch(f) else [text])
    args = build_parser().parse_args(argv)
    if name == "model":  # model_of takes it, beside the positional MODEL
        assert args.model == want
        return
    opts = engine_options(args)
    assert opts == {name: want}
    assert getattr(EngineConfig.resolve(**opts), name) == want


@pytest.mark.parametrize("name", sorted(ENVIRONMENT))
def test_each_variable_reaches_its_field(name, monkeypatch):
    f = next(f for f in fields(EngineConfig) if f.name == name)
    text, want = GIVEN[name]
    for var in ENVIRONMENT[name]:
        raw = "1" if is_switch(f) else text
        assert from_env(f, var, raw) == want
        monkeypatch.setenv(var, raw)
        assert getattr(EngineConfig.resolve(), name) == want
        monkeypatch.delenv(var)
    assert getattr(EngineConfig.resolve(), name) == f.default


def test_a_variable_that_is_not_a_number_is_named():
    with pytest.raises(ValueError, match="FLASHNEXT_SLOT_GROW='lots' is not a number"):
        from_env(
            next(f for f in fields(EngineConfig) if f.name == "slot_grow"),
            "FLASHNEXT_SLOT_GROW",
            "lots",
        )


def test_reference_kernels_on_cuda_when_asked():
    from flashlane.kernels import REFERENCE, select_kernels

    assert select_kernels("cuda", reference=True) is REFERENCE
    with pytest.raises(ValueError, match="decode 'fast': auto, gather, listed or walk"):
        select_kernels("cpu", decode="fast")
    for decode in ("auto", "gather", "listed", "walk"):
        assert EngineConfig.resolve(kernels=decode).kernels == decode
    with pytest.raises(ValueError, match="engine option kernels"):
        EngineConfig.resolve(kernels="triton")
