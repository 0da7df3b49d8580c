"""Test-wide settings: hypothesis runs without per-example deadlines (CI machines are shared and slow)
and, under CI, with a fixed seed so that a run is reproducible."""

import os

from hypothesis import settings

settings.register_profile("default", deadline=None)
settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "default")
