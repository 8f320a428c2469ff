"""One run: build the recipe's objects and the Trainer, plan, tune, fit, test; the engine's base classes."""
