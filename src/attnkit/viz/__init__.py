"""Plots: attention heat maps."""
