"""One error type for bad user input, reported as a single line before any rank starts."""


class ConfigError(ValueError):
    """A configuration value is invalid. The message names the value and what would be valid."""
