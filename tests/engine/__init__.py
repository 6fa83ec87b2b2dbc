"""Tests of the reference PyTorch engine (transformers is the oracle)."""
