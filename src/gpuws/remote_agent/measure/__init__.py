"""The profiling tiers: Tier 1 CUDA-event timing and its statistics, Tier 2 kernel
timelines (torch.profiler injected, nsys, one ncu pass), and the order they run in."""
