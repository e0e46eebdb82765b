"""The HTTP request path: one internal conversation and output stream, adapted per API surface."""
