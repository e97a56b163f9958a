"""Side by side with Lightning Fabric: modules whose subject is the comparison (they need .venv-lightning, made by
.ci/setup, and skip without it)."""
