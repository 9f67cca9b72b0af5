"""Peak GPU memory: the model-size ladder against the estimator, and the memory probe."""
