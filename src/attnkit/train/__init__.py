"""Training: losses, schedules, atomic checkpoints and the training loop."""
