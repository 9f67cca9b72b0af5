"""`python -m bench.faults`: the campaign runner, faults/run.py."""

import sys

from bench.faults.run import main

sys.exit(main())
