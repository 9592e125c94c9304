"""Errors a user can cause. The CLI prints them as one line and exits with code 2."""


class UsageError(ValueError):
    """Bad input: the message names the field, the value and what is allowed."""
