"""What one check found: pass, warn, fail or skip, and for a warning or failure the fix."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check: status is pass, warn, fail or skip; fix says what to do when not pass."""

    name: str
    status: str
    detail: str
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def passed(name: str, detail: str) -> CheckResult:
    return CheckResult(name, "pass", detail)


def failed(name: str, detail: str, fix: str) -> CheckResult:
    return CheckResult(name, "fail", detail, fix)


def warned(name: str, detail: str, fix: str) -> CheckResult:
    return CheckResult(name, "warn", detail, fix)


def skipped(name: str, detail: str) -> CheckResult:
    return CheckResult(name, "skip", detail)
