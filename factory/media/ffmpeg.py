"""Running ffmpeg: one function for commands, one writer for raw frames piped to stdin."""

from __future__ import annotations

import functools
import os
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING

from factory.errors import MediaError
from factory.infra import stopping

if TYPE_CHECKING:
    import numpy as np

STDERR_TAIL = 4000
QUIET = ("-hide_banner", "-nostdin", "-loglevel", "error", "-y")


@functools.cache
def ffmpeg_exe() -> str:
    import imageio_ffmpeg

    return imageio_ffmpeg.get_ffmpeg_exe()


def run(argv: Sequence[str], *, timeout: float | None = None) -> None:
    """Run one ffmpeg command; a non-zero exit raises MediaError with the stderr tail.

    While it runs, the holder's stop signal (factory.infra.stopping) is polled: a worker that lost
    its job kills ffmpeg and stops instead of encoding on for minutes."""
    run_output(argv, timeout=timeout)


def run_output(argv: Sequence[str], *, timeout: float | None = None) -> str:
    """`run`, giving what the command printed to stderr (where filters such as `ebur128` and
    `loudnorm` print their measurements)."""
    signal = stopping.current()
    with tempfile.TemporaryFile() as stderr:
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=stderr)  # fmt: skip
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                proc.wait(timeout=0.2 if signal is not None else timeout)
                break
            except subprocess.TimeoutExpired:
                if signal is not None and signal.stopped:
                    proc.kill()
                    proc.wait()
                    signal.check()
                if deadline is not None and time.monotonic() >= deadline:
                    proc.kill()
                    proc.wait()
                    raise MediaError(argv, -9, f"timed out after {timeout} s; "
                                     + _tail(stderr)) from None  # fmt: skip
        if proc.returncode != 0:
            raise MediaError(argv, proc.returncode, _tail(stderr))
        stderr.seek(0)
        return stderr.read().decode(errors="replace")


def _tail(stderr: IO[bytes]) -> str:
    stderr.seek(0)
    return stderr.read().decode(errors="replace")[-STDERR_TAIL:]


@functools.cache
def has_filter(name: str) -> bool:
    done = subprocess.run(
        [ffmpeg_exe(), "-hide_banner", "-filters"], capture_output=True, text=True
    )
    return any(line.split()[1:2] == [name] for line in done.stdout.splitlines())


class RawVideoWriter:
    """Feeds rgb24 frames to an ffmpeg process reading ``-f rawvideo -i -``."""

    def __init__(self, argv: Sequence[str]) -> None:
        self.argv = list(argv)
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close/abort
        self._proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stderr=self._stderr)

    def write(self, frames: np.ndarray) -> None:
        import numpy as np  # (imported where used: the presets and keys need none of it)

        assert frames.dtype == np.uint8 and frames.ndim == 4 and frames.shape[-1] == 3
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(np.ascontiguousarray(frames).tobytes())
        except BrokenPipeError:
            self._fail()

    def close(self) -> None:
        assert self._proc.stdin is not None
        with suppress(BrokenPipeError):
            self._proc.stdin.close()
        if self._proc.wait() != 0:
            self._fail()
        self._stderr.close()

    def abort(self) -> None:
        self._proc.kill()
        self._proc.wait()
        self._stderr.close()

    def _fail(self) -> None:
        self._proc.kill()
        returncode = self._proc.wait()
        self._stderr.seek(0)
        tail = self._stderr.read().decode(errors="replace")[-STDERR_TAIL:]
        self._stderr.close()
        raise MediaError(self.argv, returncode, tail)

    def __enter__(self) -> RawVideoWriter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()


@contextmanager
def atomic_output(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path``, renamed onto it only if the block succeeds.

    The temporary name keeps the real extension last (``x.part-123.mkv``) so ffmpeg still
    picks the container from it; a crash leaves only ``*.part-*`` files, never a half
    ``x.mkv`` that would count as done.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.stem}.part-{os.getpid()}-{uuid.uuid4().hex[:8]}{path.suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
