"""Shared helpers every room may use: canonical bytes (JCS), exact JSON/YAML documents,
Ed25519 key checks, JSON log lines, the package version. They import none of the other rooms."""
