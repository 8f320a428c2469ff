"""Nothing lost: checkpoints, exact resume, stops at safe points, DDP failures, SLURM."""
