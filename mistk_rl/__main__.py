import sys

from mistk_rl.cli import main

sys.exit(main())
