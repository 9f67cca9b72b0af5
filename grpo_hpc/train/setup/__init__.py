"""What a training process sets up before its loop: the model and tokenizer (models.py),
each ``auto`` setting resolved for this device (autos.py)."""
