"""Errors a user can fix. The CLI prints them as one line and exits 2."""


class UserError(Exception):
    """Bad input: a config key, a file, a model directory, a domain name, a dataset line."""
