"""Error types shared by every layer: each carries a message a user can act on."""

import signal


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


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(KeyboardInterrupt):
    """Ctrl-C (SIGINT) or SIGTERM asked a long-running command (`serve`, `cluster up`) to stop.

    Both commands stop cleanly and exit with 128 + the signal's number (130 for Ctrl-C, 143 for SIGTERM): what a
    shell reports for a process a signal ended, so `railyard serve && next-step` does not go on as if the server
    had finished its job. The code is railyard's own, not the signal's re-raised: it does not change when SIGINT
    was ignored at start (a background job of a non-interactive shell inherits it so)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    @staticmethod
    def handler(signum: int, _frame: object) -> None:
        """A signal handler (signal.signal) that raises Stopped where the main thread is."""
        raise Stopped(signum)


class UnknownLoRAError(InvalidRequestError, LookupError):
    """A request names a LoRA adapter the engine has not loaded (HTTP 404, as an unknown model is)."""
