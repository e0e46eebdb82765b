"""Which models are in memory: a pure decision core and the async shell that acts on it."""
