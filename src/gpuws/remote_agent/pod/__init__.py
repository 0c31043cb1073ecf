"""What the pod is: the probe, its GPUs (inventory, selection, clocks), its Python
interpreters and the profiling tools installed there."""
