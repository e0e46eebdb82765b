"""What models exist: the registry file's schema, loading, sizing and diffs."""
