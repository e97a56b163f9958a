"""Shared test helpers: the bounded process runner (harness), jobs run on N ranks (jobs/), scripts run as processes
(scripts/), real clusters (cluster/) and the litgpt tier's files (litgpt/)."""
