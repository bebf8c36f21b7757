"""`python -m expctl` (also what torchrun's `-m expctl run ...` starts)."""

import sys

from expctl.cli import main

sys.exit(main())
