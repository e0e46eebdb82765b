"""Failover entries: one name over several targets (docs/backends.md#failover)."""
