"""``scripts/benchmark.py``: ways to train the recipe, timed side by side."""
