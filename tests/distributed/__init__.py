"""Distributed tier on CPU: modules with tests that start several processes (gloo process groups, launchers, jobs on N
ranks)."""
