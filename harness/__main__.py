"""`python -m harness ...` is `mistk-rl ...` (for a checkout without the console script)."""

import sys

from harness.cli import main

if __name__ == "__main__":
    sys.exit(main())
