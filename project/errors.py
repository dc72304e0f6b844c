"""The one exception the CLI turns into a clean one-paragraph error instead of a traceback."""


class ConfigError(ValueError):
    """A config value its type cannot rule out but the run cannot use (names the key, the value, what is allowed)."""
