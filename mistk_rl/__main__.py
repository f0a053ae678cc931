"""`python -m mistk_rl serve ...`: how services are started (the full `mistk-rl` command is
`harness.cli`, the driver layer's)."""

import sys

from mistk_rl.service.cli import main

if __name__ == "__main__":  # guarded: spawn/forkserver children import this module too
    sys.exit(main())
