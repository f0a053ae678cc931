import sys

from mistk_rl.cli import main

if __name__ == "__main__":  # guarded: spawn/forkserver children import this module too
    sys.exit(main())
