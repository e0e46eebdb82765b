"""The process: the composition root (build.py), uvicorn and signals, hot reload, the lock and logs."""
