"""The package's paperwork: the Apache-2.0 LICENSE the metadata names, the bench extra that
`bench serve --plot` needs, and the plot it draws."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from flashlane.bench.serve import plot

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).parents[1]
# md5 of https://www.apache.org/licenses/LICENSE-2.0.txt, the standard text
APACHE_2_MD5 = "3b83ef96387f14655fc854ddc3c6bd57"


def test_license_is_the_apache_2_text_the_metadata_names():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == {"text": "Apache-2.0"}
    assert hashlib.md5((ROOT / "LICENSE").read_bytes()).hexdigest() == APACHE_2_MD5


def test_bench_extra_installs_what_the_plot_needs(tmp_path):
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert any(d.startswith("matplotlib") for d in extras["bench"])
    rows = [{"concurrency": c, "output_tok_s": 10.0 * c} for c in (1, 2, 4)]
    out = tmp_path / "tok_s.png"
    assert plot(rows, str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
