"""`python -m flashlane ...`: the CLI (what `torchrun ... -m flashlane serve ...` starts)."""

import sys

from flashlane.cli import main

sys.exit(main())
