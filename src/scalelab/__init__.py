"""ScaleLab: choose and measure distributed-training strategies with real runs."""

__version__ = "0.1.0"
