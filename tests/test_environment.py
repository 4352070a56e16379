"""Where the package reads the environment. Engine options are read once, in
EngineConfig.resolve, from the variables its fields name (tests/cli/test_flag_table.py); a
module that reads a variable anywhere else is listed here with the reason, so that a new
switch read inside the engine is a decision, not an accident."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "flashlane"

# module -> why it reads the environment itself
READERS = {
    "config.py": "EngineConfig.resolve: the variables the fields name",
    "cli.py": "`flashlane info` plans under the engine's variables without an engine",
    "kernels/pdl.py": "FLASHLANE_PDL, per launch: GPU tests and benchmarks flip it between "
    "calls in one process",
    "models/hub.py": "Hugging Face's own variables (HF_HUB_OFFLINE, HF_HOME, ...)",
    "models/segments.py": "PYTORCH_CUDA_ALLOC_CONF: the user's allocator setting wins over "
    "the weights' expandable segments",
    "llama_cpp/build.py": "FLASHLANE_LLAMA_CPP: where the peer benchmark's llama.cpp is",
    "bench/common.py": "FLASHLANE_COMMIT: the commit a benchmark's JSON names",
    "parallel/group.py": "torchrun's RANK / WORLD_SIZE / MASTER_ADDR, and the transports' own "
    "(GLOO_SOCKET_IFNAME, NCCL_NVLS_ENABLE=0: NVLink multicast stays off)",
    "parallel/launch.py": "OMP_NUM_THREADS for the ranks it spawns",
}


def _reads_environment(tree: ast.AST) -> bool:
    """`os.environ` / `os.getenv`, or either imported from os."""
    names = ("environ", "getenv")
    for node in ast.walk(tree):
        is_os = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
        if is_os and node.value.id == "os" and node.attr in names:
            return True
        imported = isinstance(node, ast.ImportFrom) and node.module == "os"
        if imported and any(a.name in names for a in node.names):
            return True
    return False


def test_only_the_listed_modules_read_the_environment():
    readers = {
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if _reads_environment(ast.parse(path.read_text(), str(path)))
    }
    assert readers == set(READERS), "a new reader: make it an EngineConfig field, or list it"


def test_the_scan_sees_both_spellings():
    assert _reads_environment(ast.parse("import os\nos.environ.get('X')"))
    assert _reads_environment(ast.parse("from os import getenv"))
    assert not _reads_environment(ast.parse("environ = {}\nenviron.get('X')"))
