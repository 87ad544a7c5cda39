"""The checks of media from outside run in a child process under hard limits: an address-space
limit (FACTORY_MEDIA_CHECK_MEMORY MiB over what the interpreter and the check's own modules
take) and a CPU-time limit (FACTORY_MEDIA_CHECK_SECONDS) that the child sets on itself once
its modules are imported and before it opens the file, and a wall-clock limit the parent
keeps. A decoder bomb or a decoder's bug then ends the child, never the process that asked
(`factory validate`/`submit`, the API server's redo dry run, `preload`), and the file is
refused naming the limit it met.

    python -m factory.media.sandbox     # the child: {"kind", "path"} lines in, {"problem"} out
"""

from __future__ import annotations

import json
import math
import os
import resource
import select
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO

from factory.config.values import positive_int
from factory.media.identify import reader_error

DEFAULT_MEMORY_MIB = 1024  # of address space for the decoding (a 40 MP RGBA picture: 160 MB)
DEFAULT_CPU_SECONDS = 60
WALL_FACTOR = 3  # the wall-clock limit, in CPU-time limits (a loaded machine)
OUT_OF_MEMORY = 3  # the child's exit code when an allocation failed

_lock = threading.Lock()


def limits(env: dict[str, str] | os._Environ[str] | None = None) -> tuple[int, int]:
    """(MiB of address space, CPU seconds) a check may take."""
    env = os.environ if env is None else env
    return (positive_int(env, "FACTORY_MEDIA_CHECK_MEMORY", DEFAULT_MEMORY_MIB, unit="MiB"),
            positive_int(env, "FACTORY_MEDIA_CHECK_SECONDS", DEFAULT_CPU_SECONDS))  # fmt: skip


def sound_problem(path: Path) -> str | None:
    """Why a bed or cue cannot be used (factory.media.sound.check_sound_file), checked in a
    child under the limits."""
    return _checked("sound", path)


def video_problem(path: Path) -> str | None:
    """Why a camera move cannot be used (factory.media.control.control_problem), ditto."""
    return _checked("video", path)


def picture_problem(path: Path) -> str | None:
    """Why a picture cannot be used (factory.media.images.image_problem), ditto."""
    return _checked("picture", path)


def _checked(kind: str, path: Path) -> str | None:
    """The verdict on the file, from the checking child (one check at a time per process)."""
    memory, cpu = limits()
    with _lock:
        try:
            return _checker.check(kind, path, memory, cpu)
        except subprocess.TimeoutExpired:
            return f"could not be checked within {cpu * WALL_FACTOR} s: refused"


class _Checker:
    """The checking child, kept between checks (an interpreter's start and a decoder's
    imports cost 0.25-0.35 s here; a check of a bed, 10 ms): started at the first check,
    and again after one that ended it (a limit met, or its memory grown; an exit that says
    why). Its stdin closed (this process gone), it ends."""

    def __init__(self) -> None:
        self.child: subprocess.Popen[bytes] | None = None
        self.limits: tuple[int, int] | None = None
        self.errors: IO[bytes] | None = None  # its stderr (a pipe could fill and stop it)

    def check(self, kind: str, path: Path, memory: int, cpu: int) -> str | None:
        if self.child is None or self.child.poll() is not None or self.limits != (memory, cpu):
            self._stop()
            self.errors = tempfile.TemporaryFile()  # noqa: SIM115 (closed in _stop)
            self.child = subprocess.Popen(
                [sys.executable, "-m", "factory.media.sandbox"], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=self.errors,
                env={**os.environ, "OMP_NUM_THREADS": "1"},
            )  # fmt: skip
            self.limits = (memory, cpu)
        child = self.child
        assert child.stdin is not None and child.stdout is not None
        try:
            child.stdin.write(json.dumps({"kind": kind, "path": str(path)}).encode() + b"\n")
            child.stdin.flush()
        except BrokenPipeError:
            pass  # it ended: its exit says why, below
        ready, _, _ = select.select([child.stdout], [], [], cpu * WALL_FACTOR)
        if not ready:
            self._stop()
            raise subprocess.TimeoutExpired(child.args, cpu * WALL_FACTOR)
        line = child.stdout.readline()
        if line:
            reply = json.loads(line)
            if reply.get("ended"):
                self._stop()
            return reply["problem"]
        code = child.wait()
        stderr = ""
        if self.errors is not None:
            self.errors.seek(0)
            stderr = self.errors.read()[-4096:].decode(errors="replace")
        self.child = None
        return _ended(code, stderr, path, memory, cpu)

    def _stop(self) -> None:
        if self.child is not None and self.child.poll() is None:
            self.child.kill()
            self.child.wait()
        if self.errors is not None:
            self.errors.close()
        self.child, self.errors = None, None


def _ended(code: int, stderr: str, path: Path, memory: int, cpu: int) -> str:
    """What a child that ended in a check says of the file it was checking."""
    if code == OUT_OF_MEMORY:
        return f"needs more than {memory} MiB to decode (FACTORY_MEDIA_CHECK_MEMORY): refused"
    if code in (-signal.SIGXCPU, -signal.SIGKILL):
        return f"takes more than {cpu} s of CPU to check (FACTORY_MEDIA_CHECK_SECONDS): refused"
    if code < 0:
        return f"made its decoder fail ({signal.Signals(-code).name}): refused"
    said = (stderr.strip().splitlines() or ["no output"])[-1]  # the checker's own failure
    return f"could not be checked ({reader_error(RuntimeError(said), path)}): refused"


_checker = _Checker()


def main() -> int:
    """The child: one JSON line in ({kind, path}), one out ({problem}), until stdin ends;
    each check within FACTORY_MEDIA_CHECK_SECONDS of CPU, and the whole process within
    FACTORY_MEDIA_CHECK_MEMORY of address space over what its modules took."""
    from factory.media.control import control_problem
    from factory.media.images import image_problem
    from factory.media.sound import check_sound_file

    checks = {"sound": check_sound_file, "video": control_problem, "picture": image_problem}
    memory, cpu = limits()
    held = _address_space()
    resource.setrlimit(resource.RLIMIT_AS, (held + (memory << 20),) * 2)
    for line in sys.stdin:
        asked = json.loads(line)
        used = resource.getrusage(resource.RUSAGE_SELF)
        spent = math.ceil(used.ru_utime + used.ru_stime)
        resource.setrlimit(resource.RLIMIT_CPU, (spent + cpu, resource.RLIM_INFINITY))
        try:
            problem = checks[asked["kind"]](Path(asked["path"]))
        except MemoryError:
            return OUT_OF_MEMORY
        grown = _address_space() > held + (memory << 19)  # half the budget kept: start anew
        print(json.dumps({"problem": problem, "ended": grown}), flush=True)
        if grown:
            return 0
    return 0


def _address_space() -> int:
    """Bytes of address space this process holds now (VmSize)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) << 10
    raise RuntimeError("no VmSize in /proc/self/status")


if __name__ == "__main__":
    sys.exit(main())
