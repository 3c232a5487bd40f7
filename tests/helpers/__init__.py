"""Helpers shared by the bpuemu tests (model builders, references)."""
