"""`python -m workbench` is `python -m workbench.run`."""

import sys

from workbench.clean_exit import run_cli
from workbench.run import main

sys.exit(run_cli(main))
