"""The one error every prompt or domain problem raises, so callers catch a single type."""


class PromptError(ValueError):
    """A prompt or domain file is missing, malformed, or was rendered with bad variables."""
