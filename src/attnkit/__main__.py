"""``python -m attnkit`` (and ``torchrun -m attnkit``) run the command line."""

from attnkit.cli import program

if __name__ == "__main__":  # not when a spawned child (serve's worker processes) imports this again
    program()
