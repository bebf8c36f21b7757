"""`python -m expctl` (also what torchrun's `-m expctl run ...` starts)."""

import sys

from expctl.importpath import search_working_dir_last

search_working_dir_last()  # python -m put the working directory first: a torchvision.py there wins

from expctl.cli import main  # noqa: E402

sys.exit(main())
