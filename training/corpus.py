"""The training corpus: the Python standard library of the interpreter running the script.

Every machine that runs flashlane has it, so the embedded model trains without a download.
Files are the stdlib's `*.py` sources (code, comments and docstrings) minus test suites,
site-packages, machine-specific files and generated codec tables. The list is sorted by
relative path, each file is held out or not by a hash of that path (about 2%, stable across
Python versions and machines), and a manifest (relative path, size, sha256, split) records
exactly what a run read. Documents are joined with the EOS token between files.

    python -m training.corpus --manifest out/corpus_manifest.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sysconfig
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

EOS = "<|endoftext|>"
Split = Literal["train", "heldout"]
# One file in HELDOUT_MODULUS is held out (by the hash of its relative path).
HELDOUT_MODULUS = 50
# Directory names whose files are never read: test suites, third-party and compiled parts.
SKIP_DIRS = frozenset(
    {"test", "tests", "idle_test", "site-packages", "dist-packages", "lib-dynload", "__pycache__"}
)
# Codec modules generated from mapping tables are hex tables, not Python anyone writes.
GENERATED_MARKERS = ("Python Character Mapping Codec", "generated from 'MAPPINGS/")


@dataclass(frozen=True, slots=True)
class SourceFile:
    path: str  # relative to the stdlib root, POSIX separators
    size: int  # bytes on disk
    sha256: str  # of the file's bytes
    split: Split


def stdlib_root() -> Path:
    """The running interpreter's standard library directory."""
    return Path(sysconfig.get_paths()["stdlib"])


def split_of(rel_path: str) -> Split:
    """Held out or not, decided by the relative path alone (so the split is by file)."""
    digest = hashlib.sha256(rel_path.encode()).digest()
    return "heldout" if int.from_bytes(digest[:8], "big") % HELDOUT_MODULUS == 0 else "train"


def _is_candidate(rel: Path) -> bool:
    parts = rel.parts
    if any(p in SKIP_DIRS or p.startswith("config-") for p in parts[:-1]):
        return False
    name = parts[-1]
    return not (name.startswith(("test_", "_sysconfigdata")) or name == "conftest.py")


def _text_of(raw: bytes) -> str | None:
    """The file as UTF-8 text, or None for files that are empty, binary or generated."""
    if not raw.strip():
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    head = text[:400]
    if "\x00" in text or any(m in head for m in GENERATED_MARKERS):
        return None
    return text


def list_files(root: Path | None = None) -> list[SourceFile]:
    """The corpus files under `root` (default: this interpreter's stdlib), sorted by path."""
    root = root or stdlib_root()
    files = []
    for path in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
        rel = path.relative_to(root)
        if not path.is_file() or not _is_candidate(rel):
            continue
        raw = path.read_bytes()
        if _text_of(raw) is None:
            continue
        rel_posix = rel.as_posix()
        digest = hashlib.sha256(raw).hexdigest()
        files.append(SourceFile(rel_posix, len(raw), digest, split_of(rel_posix)))
    return files


def read_documents(files: Sequence[SourceFile], root: Path | None = None) -> Iterator[str]:
    """The text of each file in order; a file that changed since listing is an error."""
    root = root or stdlib_root()
    for f in files:
        raw = (root / f.path).read_bytes()
        if hashlib.sha256(raw).hexdigest() != f.sha256:
            raise RuntimeError(f"{root / f.path} changed since the manifest was written")
        yield raw.decode("utf-8")


def join_documents(docs: Sequence[str]) -> str:
    """One training text: the documents with EOS between them."""
    return EOS.join(docs)


def load_split(split: Split, root: Path | None = None) -> list[str]:
    """The documents of one split, in manifest order."""
    files = [f for f in list_files(root) if f.split == split]
    return list(read_documents(files, root))


def write_manifest(files: Sequence[SourceFile], out: Path, root: Path | None = None) -> dict:
    """Write the manifest JSON (interpreter, root, totals, every file) and return it."""
    root = root or stdlib_root()
    summary = {
        split: {
            "num_files": sum(f.split == split for f in files),
            "num_bytes": sum(f.size for f in files if f.split == split),
        }
        for split in ("train", "heldout")
    }
    manifest = {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "stdlib": str(root),
        "heldout_rule": f"int.from_bytes(sha256(path)[:8], 'big') % {HELDOUT_MODULUS} == 0",
        "splits": summary,
        "files": [asdict(f) for f in files],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--manifest", type=Path, required=True, help="where to write the JSON")
    parser.add_argument("--root", type=Path, default=None, help="default: the stdlib")
    args = parser.parse_args()
    manifest = write_manifest(list_files(args.root), args.manifest, args.root)
    print(json.dumps({"python": manifest["python"], **manifest["splits"]}))


if __name__ == "__main__":
    main()
