"""The ``deepspeed`` tier."""
