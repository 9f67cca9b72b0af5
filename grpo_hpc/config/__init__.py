"""The run configuration: its schema (one dataclass per section, a docstring per field),
loading from YAML and overrides, cluster profiles, and what ``auto`` resolves to. No torch.
"""
