"""`flashlane serve` where fastapi or uvicorn cannot be imported (a GPU machine without
them): the flags still parse and the command says which package is missing, instead of
"unknown flag --port"."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN = """
import sys
class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("fastapi", "uvicorn"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Blocked())
from flashlane.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _serve(*flags):
    return subprocess.run(
        [sys.executable, "-c", RUN, "serve", *flags], cwd=ROOT, capture_output=True, text=True
    )


def test_serve_names_the_missing_package():
    run = _serve("--config", "flashnext-tiny", "--random-weights", "--port", "8123")
    assert run.returncode == 2, run.stderr[-2000:]
    assert "unknown flag" not in run.stderr
    assert "flashlane serve needs" in run.stderr
    assert "fastapi" in run.stderr or "uvicorn" in run.stderr


def test_serve_help_lists_the_http_flags_without_the_server():
    run = _serve("--help")
    assert run.returncode == 0, run.stderr[-2000:]
    assert "--port" in run.stdout and "--api-key" in run.stdout
