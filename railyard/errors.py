"""Error types shared by every layer: each carries a message a user can act on."""


class RailyardError(Exception):
    """Base of all railyard errors."""


class ConfigError(RailyardError, ValueError):
    """An invalid option or combination of options (CLI exit 2, HTTP 400)."""


class InvalidRequestError(RailyardError, ValueError):
    """A request that cannot be served as given (HTTP 400); other requests are unaffected."""


class ModelLoadError(RailyardError):
    """A model directory that is missing, incomplete or malformed."""


class EngineDeadError(RailyardError):
    """The engine loop or one of its workers has died; nothing more can be served."""


class EngineOverloadedError(RailyardError):
    """Too many requests are already waiting; retry later (HTTP 503 with Retry-After)."""

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
