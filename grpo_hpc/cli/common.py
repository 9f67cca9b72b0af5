"""Shared shell of every console script: one clear line and a documented exit code.

Expected errors (GrpoError) print ``<prog>: error: <message>`` and exit with the
error's code; nothing prints a traceback unless GRPO_HPC_DEBUG=1.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from grpo_hpc.core.errors import ExitCode, GrpoError

EXIT_CODES_HELP = """exit codes:
  0  success            1  crash (unexpected error)     2  configuration/usage error
  3  circuit breaker    4  stalled                      5  checkpointed, resubmit me
  6  out of GPU memory (peak and settings that would fit in progress.json)"""


class Parser(argparse.ArgumentParser):
    """argparse that exits with CONFIG_ERROR (2) and one line, like everything else."""

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        sys.exit(ExitCode.CONFIG_ERROR)


def run_cli(prog: str, fn: Callable[[], int]) -> int:
    """Run ``fn`` turning expected errors into one line on stderr and an exit code."""
    try:
        return int(fn())
    except GrpoError as e:
        if os.environ.get("GRPO_HPC_DEBUG"):
            raise
        for line in str(e).splitlines() or [type(e).__name__]:  # one line per problem
            sys.stderr.write(f"{prog}: error: {line}\n")
        return int(e.exit_code)
    except KeyboardInterrupt:
        sys.stderr.write(f"{prog}: interrupted\n")
        return 130
