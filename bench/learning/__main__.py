"""`python -m bench.learning`: the runner, learning/run.py."""

from bench.learning.run import main

main()
