"""The policy decision point: pure, deterministic, no I/O and no clock reads."""
