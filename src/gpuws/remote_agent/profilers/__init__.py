"""Nsight Compute and Nsight Systems: choosing and installing them, building their
command lines, reading their output and reports, occupancy from kernel attributes."""
