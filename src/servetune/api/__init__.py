"""The API layer: every wire protocol, written once against the ``Backend`` interface (see docs/architecture.md)."""
