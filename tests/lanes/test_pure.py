"""lanes/ and sessions/ are plain Python (DESIGN.md section 2): every module imports in a
process where torch, numpy and triton cannot be imported."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PURE = ("lanes", "sessions")
BLOCKER = """
import importlib, sys
class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "numpy", "triton"):
            raise ImportError(f"{name} is blocked: this module must not need it")
sys.meta_path.insert(0, Blocked())
for name in sys.argv[1:]:
    importlib.import_module(name)
"""


def test_pure_packages_import_without_torch():
    modules = [
        f"flashlane.{package}.{path.stem}"
        for package in PURE
        for path in sorted((ROOT / "flashlane" / package).glob("*.py"))
        if path.stem != "__init__"
    ]
    assert len(modules) > 10
    run = subprocess.run(
        [sys.executable, "-c", BLOCKER, *modules], cwd=ROOT, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-2000:]


def test_the_blocker_blocks():
    run = subprocess.run(
        [sys.executable, "-c", BLOCKER, "flashlane.sampling.choose"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert run.returncode != 0 and "is blocked" in run.stderr
