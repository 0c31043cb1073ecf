"""Pod-side workloads. Standard library at import time; CuPy/torch only inside functions."""
