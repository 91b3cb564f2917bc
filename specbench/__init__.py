"""specbench: speculative decoding research framework."""

__version__ = "0.1.0"
