"""Peak GPU memory per rank, estimated from a model's config.json and the run's settings
(estimate), the means that make a plan fit a budget (fit), and what grpo-submit and the
trainer ask of it (plan). No torch.
"""
