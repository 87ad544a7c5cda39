"""Every error the factory raises on purpose, by meaning.

Three families decide what happens next:

- ``BadInput``: the caller asked for something wrong (manifest, argument, unknown job).
  Nothing was written. The CLI exits 2 with the message.
- ``RetryableError``: an infrastructure fault (a connection, a gateway, a busy database).
  The same step may succeed if run again.
- ``PermanentError``: running the same step again cannot help (an illegal transition, a
  writer fenced out by a newer attempt, a broken model directory).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


class FactoryError(Exception):
    """Base of the factory's own errors; ``exit_code`` is what the CLI returns."""

    exit_code = 1


class BadInput(FactoryError):
    exit_code = 2

    def __init__(self, message: str, *, field: str | None = None) -> None:
        self.field = field
        super().__init__(f"{field}: {message}" if field else message)


@dataclass(frozen=True)
class FieldProblem:
    path: str  # e.g. "videos[3].duration"
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class ManifestError(BadInput):
    """A manifest that cannot be accepted; carries every problem found, each with its path."""

    def __init__(self, source: str, problems: Sequence[FieldProblem]) -> None:
        self.source = source
        self.problems = list(problems)
        count = len(self.problems)
        head = f"manifest {source}: " + ("1 problem" if count == 1 else f"{count} problems")
        lines = "\n".join(f"  {p}" for p in self.problems)
        FactoryError.__init__(self, f"{head}\n{lines}")
        self.field = self.problems[0].path if self.problems else None


class NoSuchJob(BadInput):
    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        super().__init__(f"no job with id {job_id!r}", field="job")


class SpecConflict(BadInput):
    """The same job id was submitted before with a different spec; nothing is overwritten."""

    def __init__(self, job_id: str, path: str) -> None:
        self.job_id = job_id
        super().__init__(
            f"job {job_id!r} already exists with a different spec; give the video a new id "
            "or submit under another batch name",
            field=path,
        )


class InvalidOperation(BadInput):
    """An operator action that the job's current state does not allow (cancel a done job)."""


class ConfigError(BadInput):
    """A FACTORY_* variable with a value that cannot be used."""


class RetryableError(FactoryError):
    """``reason`` is the fault alone, without what a stage does about it (for callers that
    are not stages, like the checks at submit)."""

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        self.reason = reason or message
        super().__init__(message)


class PermanentError(FactoryError):
    pass


class SchemaNotReady(PermanentError):
    pass


class IllegalTransition(PermanentError):
    def __init__(self, job_id: str, current: str, target: str) -> None:
        self.job_id, self.current, self.target = job_id, current, target
        super().__init__(f"job {job_id}: illegal transition {current} -> {target}")


class StaleAttempt(PermanentError):
    """A writer holding an old attempt number was fenced out; it must stop, it changed nothing."""

    def __init__(self, job_id: str, held: int, reason: str) -> None:
        self.job_id, self.held, self.reason = job_id, held, reason
        super().__init__(f"job {job_id}: attempt {held} is stale ({reason}); nothing was written")


class MediaError(PermanentError):
    """ffmpeg failed: carries the command, its exit code and the end of its stderr."""

    def __init__(self, argv: Sequence[str], returncode: int, stderr_tail: str) -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr_tail = stderr_tail
        tool = self.argv[0].rsplit("/", 1)[-1] if self.argv else "ffmpeg"
        super().__init__(
            f"{tool} exited with {returncode}: {stderr_tail.strip()[-500:] or '(no output)'}"
        )


class QualityGateFailed(PermanentError):
    """The outputs were made but fail a check; the job stops before delivery."""

    def __init__(self, failures: Sequence[str]) -> None:
        self.failures = list(failures)
        super().__init__("quality gate failed: " + "; ".join(self.failures))
