"""The ``litgpt`` tier."""
