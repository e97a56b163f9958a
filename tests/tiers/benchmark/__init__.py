"""The ``benchmark`` tier."""
