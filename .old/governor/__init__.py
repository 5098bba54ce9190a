"""governor: a runtime governor for AI agents (ADL Runtime Protocol 0.4.0-draft)."""

__version__ = "0.1.0"
