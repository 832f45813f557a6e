"""`python -m eagle3 <command> ...`: the `eagle3` command (what torchrun's workers run: `-m eagle3 train`)."""

import sys

from eagle3.cli import main

sys.exit(main())
