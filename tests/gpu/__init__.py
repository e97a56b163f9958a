"""CUDA tier (marked ``cuda``): skipped, with the reason, on a machine without a GPU."""
