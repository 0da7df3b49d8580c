"""Errors a user can cause, as attnkit's own exceptions.

The CLI prints these as one line and exits non-zero; anything else is a programming error and keeps
its ordinary traceback.
"""


class AttnkitError(Exception):
    """Base class for errors caused by user input (configs, files, arguments)."""


class ConfigError(AttnkitError, ValueError):
    """A configuration field has a bad value or an unknown name; the message names the field."""


class ConversionError(AttnkitError, ValueError):
    """A foreign checkpoint (HF transformers, torch.nn) cannot be mapped onto an attnkit model."""


class DataError(AttnkitError):
    """An input file is missing, empty, misaligned or not UTF-8; the message names the file and line."""
