"""``python -m attnkit`` (and ``torchrun -m attnkit``) run the command line."""

from attnkit.cli import main

main()
