"""The ``two_hosts`` tier."""
