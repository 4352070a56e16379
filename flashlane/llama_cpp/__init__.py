"""llama.cpp as a measured peer: its build (build.py), the GGUF of our checkpoints written
through its own converter (gguf.py, with the fixes of converter_fixes.py), and its tools timed
beside us (tools.py). Nothing of llama.cpp is committed: its source arrives as a tarball made
by scripts/llama_cpp_subset.py and is patched where it stands, at build or convert time."""
