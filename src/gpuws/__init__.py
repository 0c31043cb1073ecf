"""gpuws: a terminal profiling workstation for rented GPU pods.

This module is shipped inside the agent bundle too, so it must stay standard-library only.
"""

__version__ = "0.1.0"
