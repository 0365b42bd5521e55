"""Plots drawn from arrays that `uqbench.metrics` curve functions return."""
