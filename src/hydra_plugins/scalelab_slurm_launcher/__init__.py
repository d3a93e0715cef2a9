"""`hydra/launcher=slurm`: one SLURM job per sweep job (scalelab's own Hydra launcher plugin;
slurm/README.md). Its settings: config.py (registered when Hydra scans its plugins)."""
