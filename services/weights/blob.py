"""A version's bytes: one flat buffer in shared memory (``/dev/shm``) or anonymous memory, and the
host identity that decides when two processes may share such a file (``store`` holds versions in
these; the trainer's publisher and the SGS's client make them too)."""

from __future__ import annotations

import mmap
import os
import uuid
from pathlib import Path

from services.common.weights import WeightError

SHM_PREFIX = "braid-"


def private_shm_dir(kind: str, root: Path = Path("/dev/shm")) -> Path:
    """``/dev/shm/braid-<kind>-<pid>/`` for this process's blobs, after removing the directories
    of processes that no longer exist (a killed relay or trainer cannot clean up after itself)."""
    import shutil

    for d in root.glob(f"{SHM_PREFIX}*-*"):
        pid = d.name.rsplit("-", 1)[-1]
        if d.is_dir() and pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(d, ignore_errors=True)
    path = root / f"{SHM_PREFIX}{kind}-{os.getpid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def host_id() -> str:
    """This host's identity for the shared-memory fast path: boot id + the /dev/shm mount + the
    network namespace. Processes in different network namespaces stand for different hosts (two
    sites on one machine, ``bench/netns.py``): their weights cross the network between them, never
    shared memory, as they would between two machines."""
    boot = Path("/proc/sys/kernel/random/boot_id")
    boot_id = boot.read_text().strip() if boot.exists() else "unknown"
    shm = Path("/dev/shm")
    dev = os.stat(shm).st_dev if shm.exists() else 0
    try:
        net = os.stat("/proc/self/ns/net").st_ino
    except OSError:
        net = 0
    return f"{boot_id}:{dev}:{net}"


class Blob:
    """A writable flat buffer of ``size`` bytes: a shared-memory file or anonymous memory."""

    def __init__(
        self, size: int, shm_dir: Path | None = None, *, path: Path | None = None, populate: bool = False
    ) -> None:
        """``populate``: allocate and map every page now (a writer then copies at memory speed
        instead of taking a page fault per 4 KiB: the trainer's spare snapshot buffer)."""
        self.size = size
        self.path: Path | None = None
        if path is not None:  # adopt an existing file (push by reference)
            fd = os.open(path, os.O_RDWR)
            self.path = path
        elif shm_dir is not None:
            self.path = shm_dir / f"{SHM_PREFIX}{uuid.uuid4().hex}.blob"
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            os.ftruncate(fd, max(size, 1))
            if populate:
                os.posix_fallocate(fd, 0, max(size, 1))
        else:
            fd = -1
        try:
            if fd >= 0 and os.fstat(fd).st_size < size:
                raise WeightError("argument", f"shared-memory blob {path} is smaller than {size} bytes")
            populate = populate or path is not None  # an existing file is mapped in one go
            extra = mmap.MAP_POPULATE if populate else 0
            if fd >= 0:
                self._mm = mmap.mmap(fd, max(size, 1), flags=mmap.MAP_SHARED | extra)
            else:
                self._mm = mmap.mmap(-1, max(size, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | extra)
        finally:
            if fd >= 0:
                os.close(fd)
        self.view = memoryview(self._mm)[:size]

    def move_to(self, directory: Path) -> None:
        """Rename the backing file into ``directory`` (the relay owns it from now on)."""
        if self.path is not None:
            target = directory / f"{SHM_PREFIX}{uuid.uuid4().hex}.blob"
            os.rename(self.path, target)
            self.path = target

    def release(self) -> None:
        """Unlink the backing file. The memory itself goes when the last reference to this blob
        (a forwarder, a pull stream, tensors viewing it) is dropped: readers never see it vanish."""
        if self.path is not None:
            self.path.unlink(missing_ok=True)


def memory_bytes() -> int:
    """This machine's physical memory: no version larger than it can ever be held here."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
