"""Find or build llama.cpp (build b11434, the one whose source we carry).

    python -m flashlane.llama_cpp.build --src .peer/src --build .peer/build --cuda

A build is a folder with bin/llama-batched-bench, bin/llama-bench and bin/llama-server;
`find_build` takes it from an argument or FLASHLANE_LLAMA_CPP. Before building, the source gets
the one C++ fix our checkpoints need (`patch_sources`).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ENV = "FLASHLANE_LLAMA_CPP"
BUILD_NUMBER = 11434
TOOLS = ("llama-batched-bench", "llama-bench", "llama-server")
# the flags of issue 27: sm_90 only, no NCCL, no UI, no tests; shared libraries link fastest
COMMON_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release", f"-DLLAMA_BUILD_NUMBER={BUILD_NUMBER}",
    f"-DLLAMA_BUILD_COMMIT=b{BUILD_NUMBER}", "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF", "-DBUILD_SHARED_LIBS=ON",
)  # fmt: skip
CUDA_FLAGS = (
    "-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90-real", "-DGGML_CUDA_FA_QUANTS=f16-f16",
    "-DGGML_CUDA_NCCL=OFF",
)  # fmt: skip


# the CMake cache entries a result names: what decides the speed of the build it measured
CACHE_KEYS = (
    "CMAKE_BUILD_TYPE",
    "BUILD_SHARED_LIBS",
    "LLAMA_BUILD_NUMBER",
    "GGML_NATIVE",
    "GGML_CUDA",
    "CMAKE_CUDA_ARCHITECTURES",
    "GGML_CUDA_FA_QUANTS",
    "GGML_CUDA_NCCL",
    "GGML_CUDA_GRAPHS",
    "CMAKE_CUDA_COMPILER_VERSION",
)


@dataclass(frozen=True, slots=True)
class LlamaBuild:
    """A built llama.cpp: where its tools are, its source and how it was configured."""

    bin_dir: Path
    src: Path | None  # the source tree it was built from (its converter), from the cache
    build: str  # "b11434 (cuda)": the build number and backend
    flags: dict[str, str]  # CACHE_KEYS -> value, from its CMakeCache.txt

    def tool(self, name: str) -> Path:
        return self.bin_dir / name


def find_build(path: str | os.PathLike | None = None) -> LlamaBuild:
    """The llama.cpp build at `path` (a build folder or its bin/), else at $FLASHLANE_LLAMA_CPP;
    a clear error when neither holds the tools."""
    where = path or os.environ.get(ENV)
    if not where:
        raise FileNotFoundError(f"no llama.cpp build: pass its folder or set {ENV}")
    root = Path(where)
    bin_dir = root / "bin" if (root / "bin").is_dir() else root
    missing = [t for t in TOOLS if not (bin_dir / t).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{bin_dir}: no {', '.join(missing)} (build llama.cpp first: "
            "python -m flashlane.llama_cpp.build)"
        )
    cache = bin_dir.parent / "CMakeCache.txt"
    entries: dict[str, str] = {}
    if cache.is_file():
        for line in cache.read_text(errors="replace").splitlines():
            key, sep, value = line.partition("=")
            if sep and not line.startswith(("#", "//")):
                entries[key.partition(":")[0]] = value
    flags = {k: entries[k] for k in CACHE_KEYS if k in entries}
    src = Path(entries["CMAKE_HOME_DIRECTORY"]) if "CMAKE_HOME_DIRECTORY" in entries else None
    backend = "cuda" if flags.get("GGML_CUDA") == "ON" else "cpu"
    number = flags.get("LLAMA_BUILD_NUMBER", "?")
    return LlamaBuild(bin_dir, src, f"b{number} ({backend})", flags)


# llama.cpp sizes the PLE's key and value projections by the hidden size; ours take the
# n-gram heads' rows side by side (ple_embed_dim), which equals the hidden size in the presets
# but not in the embedded model. The graph already reads the heads' width.
PLE_FIX = (
    ("layer.ple_key        = create_tensor(tn(LLM_TENSOR_PLE_KEY,        \"weight\", il), "
     "{ n_embd, hc_dim }", "{ n_embd, hc_dim }", "{ ple_width, hc_dim }"),
    ("layer.ple_value      = create_tensor(tn(LLM_TENSOR_PLE_VALUE,      \"weight\", il), "
     "{ n_embd, n_embd }", "{ n_embd, n_embd }", "{ ple_width, n_embd }"),
)  # fmt: skip
PLE_WIDTH = "const int64_t ple_width = (int64_t) hparams.ple_head_dim * hparams.ple_n_heads;"


def patch_sources(src: Path) -> bool:
    """Apply PLE_FIX to src/models/qwen4exp.cpp once; True if it changed the file."""
    path = Path(src) / "src" / "models" / "qwen4exp.cpp"
    text = path.read_text()
    if PLE_WIDTH in text:
        return False
    for line, old, new in PLE_FIX:
        if text.count(line) != 1:
            raise RuntimeError(f"{path}: not the b{BUILD_NUMBER} source (no {line!r})")
        text = text.replace(line, line.replace(old, new))
    anchor = "        if (hparams.is_ple(il)) {\n            layer.ple_key"
    if text.count(anchor) != 1:
        raise RuntimeError(f"{path}: not the b{BUILD_NUMBER} source (the PLE tensors moved)")
    head, _, tail = anchor.partition("\n")
    text = text.replace(anchor, f"{head}\n            {PLE_WIDTH}\n{tail}")
    path.write_text(text)
    return True


def build(src: Path, out: Path, cuda: bool, jobs: int) -> LlamaBuild:
    """Configure (once) and build TOOLS; ninja skips what is up to date."""
    patch_sources(src)
    if not (out / "build.ninja").is_file():
        flags = [*COMMON_FLAGS, *(CUDA_FLAGS if cuda else ("-DGGML_CUDA=OFF",))]
        _run(["cmake", "-S", str(src), "-B", str(out), "-G", "Ninja", *flags])
    _run(["cmake", "--build", str(out), "-j", str(jobs), "--target", *TOOLS])
    return find_build(out)


def _run(cmd: list[str]) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {' '.join(cmd)}", flush=True)
    subprocess.run(cmd, check=True)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--src", type=Path, required=True, help="the extracted llama.cpp source")
    p.add_argument("--build", type=Path, required=True, help="the build folder")
    p.add_argument("--cuda", action="store_true", help="the CUDA backend for sm_90")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    found = build(args.src, args.build, args.cuda, args.jobs)
    print(
        f"[{time.strftime('%H:%M:%S')}] llama.cpp {found.build} in {found.bin_dir} "
        f"({time.perf_counter() - t0:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
