"""Devices: which accelerator, how many processes, memory, CUDA graphs."""
