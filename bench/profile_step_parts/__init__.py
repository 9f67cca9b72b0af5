"""The parts of ``bench/profile_step.py`` (issue 24's profiled step), one thing each.

- ``attribution``: the phases and categories, and the profiler's events read into them
  (:class:`attribution.Attribution`, :func:`attribution.summarize`);
- ``step``: the real trainer built on a shape's random weights, instrumented, and one step
  profiled after warm-up (:func:`step.profile_one`);
- ``tables``: one shape's markdown table, and its JSON and table written (:func:`tables.write`).

``bench/profile_step.py`` is the entry (``python -m bench.profile_step ...``: the command
line, one child process per shape, the summary) and re-exports every name.
"""
