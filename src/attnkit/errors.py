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


def require_one_of(field: str, value: object, allowed: tuple) -> None:
    """A ``ConfigError`` naming ``field``, ``value`` and the allowed values, unless ``value`` is one."""
    if value not in allowed:
        raise ConfigError(f"{field} must be one of {', '.join(map(repr, allowed))}; got {value!r}")


def require_at_least(field: str, value: float, low: float, *, strictly: bool = False) -> None:
    """A ``ConfigError`` unless ``value`` is a finite number ``>= low`` (``> low`` when ``strictly``)."""
    if value != value or value in (float("inf"), float("-inf")) or value < low or (strictly and value == low):
        raise ConfigError(f"{field} must be {'>' if strictly else '>='} {low}; got {value!r}")


def require_fraction(field: str, value: float) -> None:
    """A ``ConfigError`` unless ``0 <= value < 1`` (dropout rates, label smoothing, Adam's betas)."""
    if not 0.0 <= value < 1.0:
        raise ConfigError(f"{field} must be in [0, 1); got {value!r}")
