"""The ``mpi`` tier."""
