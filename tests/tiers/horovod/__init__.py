"""The ``horovod`` tier."""
