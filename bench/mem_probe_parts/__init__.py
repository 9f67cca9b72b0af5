"""The parts of ``bench/mem_probe.py`` (issue 38's probe), one thing each.

- ``probe``: a rank's records (:class:`probe.Probe`) and the byte counts of shards,
  gradients and optimizer state;
- ``hooks``: :func:`hooks.install` (the instruments hooked into the trainer) and
  :func:`hooks.child` (what torchrun runs on each rank);
- ``history``: the allocator's history over one update, summarised;
- ``profiler``: one update under ``torch.profiler``, summarised;
- ``ladder_row``: one ladder row's plan run under the probe, and the probe files summarised;
- ``merge``: a ``bench/grpo_step.py --probe`` run added to a results file.

``bench/mem_probe.py`` is the entry (``python -m bench.mem_probe ...``) and re-exports
every name.
"""
