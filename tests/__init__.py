from pathlib import Path

# Reference files the tests read, copied into the repository from the project's shared
# vectors so that a fresh clone runs every test: keyed_sampler.json (DESIGN.md section 5's
# values from an independent implementation) and flashnext_real_config.json (the real
# Flash Next config.json).
DATA = Path(__file__).resolve().parent / "data"
