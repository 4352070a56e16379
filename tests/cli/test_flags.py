"""The engine flags: vLLM's and llama.cpp's names as aliases, a hint for unknown flags, no
abbreviations, every flag documented with its default."""

from __future__ import annotations

import argparse

import pytest

from flashlane.cli import build_parser
from flashlane.config import EngineConfig
from flashlane.flags import engine_options, model_of


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def options(*argv: str) -> dict:
    return engine_options(parse(*argv))


def test_vllm_names_set_our_options(tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages[0].content }}")
    got = options(
        "serve",
        "--max-model-len",
        "4096",
        "--max-num-seqs",
        "4",
        "--gpu-memory-utilization",
        "0.5",
        "--chat-template",
        str(template),
        "--seed",
        "7",
        "--no-enable-prefix-caching",
        "--default-chat-template-kwargs",
        '{"enable_thinking": true}',
    )
    assert got == {
        "context": 4096,
        "parallel": 4,
        "gpu_memory_utilization": 0.5,
        "chat_template": str(template),
        "seed": 7,
        "prompt_cache_gb": 0.0,
        "default_chat_template_kwargs": {"enable_thinking": True},
    }
    EngineConfig.resolve(**got)  # and the engine takes them


def test_llama_cpp_short_names_and_the_positional_model():
    args = parse("serve", "-m", "some/dir", "-c", "2048", "-np", "2")
    assert model_of(args) == "some/dir"
    assert options("serve", "-m", "d", "-c", "2048", "-np", "2") == {"context": 2048, "parallel": 2}
    assert model_of(parse("serve", "ckpt")) == "ckpt"
    assert model_of(parse("serve", "ckpt", "--model", "ckpt")) == "ckpt"
    with pytest.raises(SystemExit, match="two models"):
        model_of(parse("serve", "a", "--model", "b"))
    assert options("serve", "--enable-prefix-caching") == {}  # on is the default


def test_unknown_flag_names_the_nearest(capsys):
    with pytest.raises(SystemExit) as err:
        parse("serve", "--max-model-length", "8")
    assert err.value.code == 2
    hint = "unknown flag --max-model-length; did you mean --max-model-len?"
    err = capsys.readouterr().err
    assert hint in err and "unexpected argument" not in err  # "8" was its value
    with pytest.raises(SystemExit):
        parse("generate", "--temprature", "0.5")
    assert "did you mean --temperature?" in capsys.readouterr().err


def test_bench_flags_too(capsys):
    from flashlane.bench.model import parse
    from flashlane.bench.serve import build_parser as bench_serve_parser

    with pytest.raises(SystemExit):
        bench_serve_parser().parse_args(["--concurency", "2"])
    assert "did you mean --concurrency?" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse(["--random-weights", "--stream", "1"])
    assert "did you mean --streams?" in capsys.readouterr().err
    for parser in (bench_serve_parser(),):
        assert all(a.help for a in parser._actions)


def test_no_abbreviations(capsys):
    with pytest.raises(SystemExit):
        parse("serve", "--mod", "x")
    assert "unknown flag --mod; did you mean --model?" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["serve", "generate", "info"])
def test_every_flag_has_help_with_its_default(command):
    sub = next(
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    ).choices[command]
    for action in sub._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        name = action.option_strings[0] if action.option_strings else action.dest
        assert action.help and "default" in action.help, f"{command} {name}: {action.help!r}"
    assert sub.allow_abbrev is False


def test_vllm_keywords_of_the_engine_config():
    cfg = EngineConfig.resolve(max_model_len=512, max_num_seqs=3, enable_prefix_caching=False)
    assert (cfg.context, cfg.parallel, cfg.prompt_cache_gb) == (512, 3, 0.0)
    with pytest.raises(TypeError, match="disagree"):
        EngineConfig.resolve(max_model_len=512, context=1024)
    with pytest.raises(TypeError, match="unknown engine option"):
        EngineConfig.resolve(max_model_length=512)
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        EngineConfig.resolve(gpu_memory_utilization=1.5)
