"""grpo-status: the squeue-like table and one run's detail (report, view), live progress bars,
terminal visuals and the training-curve plot.
"""
