"""Shared helpers every room may use: canonical bytes (JCS), exact JSON/YAML documents,
Ed25519 key checks, JSON log lines. They import nothing else of governor."""
