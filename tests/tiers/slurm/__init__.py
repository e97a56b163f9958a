"""The ``slurm`` tier."""
