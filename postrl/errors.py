"""Errors a user can fix. The CLI prints them as one line and exits 2. A leaf: imports nothing."""


class UserError(Exception):
    """Bad input: a config key, a file, a model directory, a domain name, a dataset line."""


class ConfigError(UserError):
    """A config problem a user can fix: names the key, and the closest valid key or value."""
