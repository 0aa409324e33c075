"""`python -m workbench` is `python -m workbench.run`."""

import sys

from workbench.run import main

sys.exit(main())
