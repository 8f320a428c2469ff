"""A PyTorch Lightning template for fast, correct GPU training: an engine around a recipe you swap.

Kept free of heavy imports so that ``scripts/*.py --help`` answers instantly.
"""

__version__ = "0.1.0"

EVAL_BATCH_SIZE = 1000  # evaluation holds no gradients: big batches, few steps

OPTIMIZERS = ("sgd", "adam", "adamw")
SCHEDULERS = ("none", "onecycle", "cosine")
SWEEP_SAMPLERS = ("tpe", "random", "grid")
SWEEP_STORAGE = "sweeps.journal"  # a journal file: safe for many processes on one machine
