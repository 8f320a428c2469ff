"""A PyTorch Lightning template for fast, correct GPU training: an engine around a recipe you swap.

Kept free of heavy imports so that ``scripts/*.py --help`` answers instantly.
"""

__version__ = "0.1.0"

EVAL_BATCH_SIZE = 1000  # evaluation holds no gradients: big batches, few steps

# Names the command line offers without importing torch; each has its builder in a registry (OPTIMIZER_BUILDERS,
# SCHEDULE_BUILDERS in training/classifier.py, LOGGER_BUILDERS in training/build.py), checked to agree at import.
OPTIMIZERS = ("sgd", "adam", "adamw")
SCHEDULERS = ("none", "onecycle", "cosine")
LOGGERS = ("tensorboard", "csv", "wandb", "mlflow")
SWEEP_SAMPLERS = ("tpe", "random", "grid")
SWEEP_STORAGE = "sweeps.journal"  # a journal file: safe for many processes on one machine
