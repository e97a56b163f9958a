"""The ``s3`` tier."""
