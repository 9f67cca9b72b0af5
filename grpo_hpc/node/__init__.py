"""The job's side on each compute node: torchrun started for the node (``launch``), the
job's own torch checked first (``job_torch``, by ``torch_build``'s rule, which preflight
also asks on the login node), and how the attempt ended (``root_cause``, job_summary.txt).

submit/ pickles the launcher on the login node, so these modules import no torch at import
time and nothing of ``train/`` (tests/unit/test_layering.py)."""
