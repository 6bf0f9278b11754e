"""The engine's own executor with its launches and waits written down in order: how tests see what the step loop
puts on the device, and when it waits for it."""

from __future__ import annotations


class RecordingExecutor:
    """Wraps the engine's executor: appends "launch" (a whole step), "forward", "sample" (a step in two parts) and
    "wait" (the loop waits for a step's tokens) to `events`; everything else goes to the executor unchanged."""

    supports_async = True

    def __init__(self, inner, events: list[str]) -> None:
        self.inner = inner
        self.events = events

    def launch(self, out):
        self.events.append("launch")
        return _Watched(self.inner.launch(out), self.events)

    def launch_forward(self, out):
        self.events.append("forward")
        return self.inner.launch_forward(out)

    def launch_sample(self, forward, bitmask=None):
        self.events.append("sample")
        return _Watched(self.inner.launch_sample(forward, bitmask), self.events)

    def __getattr__(self, name):
        return getattr(self.inner, name)


class _Watched:
    def __init__(self, pending, events: list[str]) -> None:
        self.pending = pending
        self.events = events

    def result(self):
        self.events.append("wait")
        return self.pending.result()
