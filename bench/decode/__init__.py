"""The native decode engine against HF generate: speed and agreement."""
