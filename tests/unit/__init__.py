"""Unit tier: everything runs in this process (at most a single-process helper such as mypy or a fresh interpreter);
spread over the pytest-xdist workers like every other module."""
