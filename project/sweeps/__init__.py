"""Hyperparameter sweeps with Optuna: studies, storages, parallel workers, reports."""
