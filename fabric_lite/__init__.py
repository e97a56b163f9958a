"""fabric_lite: a small, fast, drop-in Lightning-Fabric-style accelerator API for hand-written PyTorch loops.

Importing it has no side effects: no environment variables are written, no logging handler is added and no
optional backend (``torch._dynamo``, FSDP, tensorboard) is imported.
"""

from fabric_lite.fabric import Fabric
from fabric_lite.utilities.seed import seed_everything
from fabric_lite.wrappers import is_wrapped

__version__ = "0.1.0"
__all__ = ["Fabric", "__version__", "is_wrapped", "seed_everything"]
