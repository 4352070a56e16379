"""The corpus: a sorted, deterministic manifest with a held-out split decided by file."""

from pathlib import Path

import pytest

from training import corpus


def _fake_stdlib(root: Path) -> None:
    files = {
        "os.py": "import sys\n",
        "json/__init__.py": '"""JSON."""\n',
        "json/decoder.py": "def decode(s):\n    return s\n",
        "test/test_os.py": "assert True\n",
        "unittest/test/test_case.py": "pass\n",
        "idlelib/idle_test/htest.py": "pass\n",
        "site-packages/pkg/mod.py": "pass\n",
        "empty/__init__.py": "",
        "encodings/cp1252.py": '""" Python Character Mapping Codec cp1252 generated from..."""\n',
        "_sysconfigdata__linux.py": "build_time_vars = {}\n",
    }
    files.update({f"pkg{i:03d}/m.py": f"x = {i}\n" for i in range(300)})
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_list_files_skips_tests_and_generated_files(tmp_path):
    _fake_stdlib(tmp_path)
    paths = [f.path for f in corpus.list_files(tmp_path)]
    assert paths == sorted(paths)
    kept = {"os.py", "json/__init__.py", "json/decoder.py"}
    kept |= {f"pkg{i:03d}/m.py" for i in range(300)}
    assert set(paths) == kept


def test_split_is_deterministic_and_by_file(tmp_path):
    _fake_stdlib(tmp_path)
    first, second = corpus.list_files(tmp_path), corpus.list_files(tmp_path)
    assert first == second
    for f in first:
        assert f.split == corpus.split_of(f.path)
    heldout = [f for f in first if f.split == "heldout"]
    assert 0 < len(heldout) < len(first) * 0.06
    # The split depends on the relative path only, not on the file's content or root.
    (tmp_path / "os.py").write_text("changed = 1\n")
    assert corpus.split_of("os.py") == next(f.split for f in first if f.path == "os.py")


def test_real_stdlib_split(tmp_path):
    files = corpus.list_files()
    splits = {f.split for f in files}
    assert splits == {"train", "heldout"}
    share = sum(f.size for f in files if f.split == "heldout") / sum(f.size for f in files)
    assert 0.005 < share < 0.06
    manifest = corpus.write_manifest(files, tmp_path / "m.json")
    assert manifest["splits"]["heldout"]["num_files"] == sum(f.split == "heldout" for f in files)
    assert not any("/test/" in f"/{f.path}" for f in files)


def test_read_documents_checks_hashes_and_joins_with_eos(tmp_path):
    _fake_stdlib(tmp_path)
    files = corpus.list_files(tmp_path)[:2]
    docs = list(corpus.read_documents(files, tmp_path))
    assert corpus.join_documents(docs) == docs[0] + "<|endoftext|>" + docs[1]
    (tmp_path / files[0].path).write_text("tampered\n")
    with pytest.raises(RuntimeError, match="changed"):
        list(corpus.read_documents(files, tmp_path))
