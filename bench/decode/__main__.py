"""`python -m bench.decode`: the runner, decode/run.py."""

from bench.decode.run import main

main()
