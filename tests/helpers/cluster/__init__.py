"""Real clusters on this machine for the test tiers that need one (SLURM)."""
