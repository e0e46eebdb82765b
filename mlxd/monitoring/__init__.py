"""The /v1/status document and the Prometheus collector, built from one snapshot of the manager."""
