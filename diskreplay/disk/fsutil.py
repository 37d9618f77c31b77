"""Small filesystem helpers: durable atomic writes, preallocation, free-space checks."""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import re
import secrets
import shutil

from ..errors import InsufficientSpaceError, StoreIOError, StorePermissionError

_ZEROS = bytes(1 << 20)


def fsync_dir(path: str) -> None:
    """Make a rename or file creation in directory ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# Temporary outputs: ``.<name>.<pid>.<16 hex>.tmp`` beside the output, hidden, unguessable,
# naming the process that writes it (a later writer of the same output removes those of
# processes that died: ``sweep_temps``).
TEMP_NAME = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.[0-9a-f]{16}\.tmp$")


def temp_name(path: str) -> str:
    """A fresh temporary name beside ``path`` (see ``TEMP_NAME``); nothing is created."""
    directory, name = os.path.split(os.path.abspath(path))
    return os.path.join(directory, f".{name}.{os.getpid()}.{secrets.token_hex(8)}.tmp")


def create_temp(tmp: str, directory: bool = False) -> None:
    """Create ``tmp`` new (``O_CREAT | O_EXCL | O_NOFOLLOW``, or ``mkdir``): a symlink or any
    file planted there makes it fail instead of being followed; the permissions are those
    of a plain new file (``0o666``, or ``0o777``, less the umask)."""
    if directory:
        os.mkdir(tmp, 0o777)
        return
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666))


def discard(tmp: str | None) -> None:
    """Remove a temporary file or directory of ours, if it is there (never following a symlink)."""
    if tmp is None:
        return
    try:
        if os.path.isdir(tmp) and not os.path.islink(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            os.unlink(tmp)
    except OSError:
        pass


def sweep_temps(path: str) -> None:
    """Remove the temporary outputs of ``path`` that processes which died left (``kill -9``
    mid-export); those of live processes, this one included, stay."""
    directory, name = os.path.split(os.path.abspath(path))
    try:
        entries = os.listdir(directory)
    except OSError:
        return
    for entry in entries:
        m = TEMP_NAME.match(entry)
        if m and m.group("name") == name and not _alive(int(m.group("pid"))):
            discard(os.path.join(directory, entry))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's
    return True


@contextlib.contextmanager
def atomic_replace(path: str, directory: bool = False):
    """Yield a new temporary file (or, with ``directory``, a directory) beside ``path`` for
    the block to write the new output in (``create_temp``: never a planted symlink).

    When the block ends normally it is synced and renamed over ``path`` (which, if it is a
    symlink, is replaced itself: its target is never written), so a crash leaves the old or
    the new output, whole; when it raises, it is removed. The name is set before the file
    exists, inside the ``try``, so that an interruption at any line leaves nothing behind
    (a ``try:`` line of its own would be outside the handler)."""
    sweep_temps(path)
    tmp = None
    try:
        for _ in range(100):
            tmp = temp_name(path)
            try:
                create_temp(tmp, directory)
                break
            except FileExistsError:  # planted (the names are not guessable): never ours to remove
                tmp = None
        else:
            raise FileExistsError(errno.EEXIST, "100 temporary names in a row exist", path)
        yield tmp
        _commit(tmp, path, directory)
    except BaseException:
        discard(tmp)
        raise


def replace_directory(new: str, path: str) -> None:
    """Rename the directory ``new`` to ``path``. Whatever is there (the caller checked it may
    go: an old directory, a file, a symlink, never followed) is swapped with the new one in
    one step where the filesystem can, so that no instant has neither, else moved aside
    first; then removed. Over nothing or an empty directory, a plain rename."""
    empty_dir = os.path.isdir(path) and not os.path.islink(path) and not os.listdir(path)
    if os.path.lexists(path) and not empty_dir:
        if not exchange(new, path):
            old = temp_name(path)
            os.rename(path, old)
            os.rename(new, path)
            new = old
        discard(new)
    else:
        os.replace(new, path)


def _commit(tmp: str, path: str, directory: bool) -> None:
    if directory:
        fsync_dir(tmp)
        replace_directory(tmp, path)
    else:
        fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


def _renameat2():
    try:
        fn = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    fn.restype = ctypes.c_int
    return fn


_RENAMEAT2 = _renameat2()
_AT_FDCWD, _RENAME_EXCHANGE = -100, 2


def exchange(a: str, b: str) -> bool:
    """Swap the paths ``a`` and ``b`` atomically (``renameat2(RENAME_EXCHANGE)``); False where
    the C library or the filesystem cannot (nothing moved then)."""
    if _RENAMEAT2 is None:
        return False
    if _RENAMEAT2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), b)


def atomic_write(path: str, data: bytes) -> None:
    """Replace ``path`` by ``data`` so that a crash leaves the old or the new file, whole."""
    with atomic_replace(path) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)


def free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def check_free_space(path: str, needed: int) -> None:
    """Refuse up front when the filesystem of ``path`` cannot hold ``needed`` more bytes."""
    available = free_bytes(path)
    if needed > available:
        raise InsufficientSpaceError(
            errno.ENOSPC,
            f"not enough free space for the store at {path}: it needs {format_bytes(needed)} "
            f"({needed} bytes), the filesystem has {format_bytes(available)} ({available} bytes) free")


def preallocate(fd: int, offset: int, length: int, path: str) -> None:
    """Reserve disk blocks for ``[offset, offset+length)`` so later writes through mmap cannot hit ENOSPC."""
    if length <= 0:
        return
    try:
        os.posix_fallocate(fd, offset, length)
        return
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise InsufficientSpaceError(
                errno.ENOSPC, f"not enough free space to preallocate {format_bytes(length)} for {path}") from exc
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise io_error(f"preallocating {path}", exc) from exc
    # Filesystem without fallocate: write zeros, which allocates the blocks just as well.
    pos = offset
    end = offset + length
    while pos < end:
        try:
            pos += os.pwrite(fd, _ZEROS[: min(len(_ZEROS), end - pos)], pos)
        except OSError as exc:
            raise io_error(f"preallocating {path}", exc) from exc


def preallocate_file(path: str, length: int, *, create: bool = False) -> None:
    """Reserve blocks for the first ``length`` bytes of ``path`` (extending it), durably."""
    try:
        fd = os.open(path, os.O_RDWR | (os.O_CREAT | os.O_TRUNC if create else 0), 0o644)
    except OSError as exc:
        raise io_error(f"creating {path}", exc) from exc
    try:
        preallocate(fd, 0, length, path)
        if os.fstat(fd).st_size < length:
            os.ftruncate(fd, length)
        os.fsync(fd)
    except OSError as exc:
        if isinstance(exc, (InsufficientSpaceError, StoreIOError, StorePermissionError)):
            raise
        raise io_error(f"preallocating {path}", exc) from exc
    finally:
        os.close(fd)


def io_error(what: str, exc: OSError) -> Exception:
    """A DiskReplayError for an OSError raised while doing ``what``."""
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return StorePermissionError(exc.errno, f"{what}: {exc.strerror or exc}")
    if exc.errno == errno.ENOSPC:
        return InsufficientSpaceError(exc.errno, f"{what}: no space left on device")
    return StoreIOError(exc.errno, f"{what}: {exc.strerror or exc}")


def format_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def close_fd(fd: int) -> int:
    """Close ``fd`` if it is open and return -1, for the caller to store in the same
    statement (``self.fd = close_fd(self.fd)``): an exception between two lines can then
    never leave a closed descriptor recorded as open, and a close repeated after one
    (EBADF) is ignored."""
    if fd >= 0:
        try:
            os.close(fd)
        except OSError as exc:
            if exc.errno != errno.EBADF:
                raise
    return -1


def _sync_file_range():
    """libc's ``sync_file_range`` (Linux), or None where there is none."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    fn.restype = ctypes.c_int
    return fn


_SYNC_FILE_RANGE = _sync_file_range()
SYNC_FILE_RANGE_WRITE = 2  # start writeback of the dirty pages in the range; do not wait for it
HAS_EARLY_WRITEBACK = _SYNC_FILE_RANGE is not None


def start_writeback(fd: int, offset: int, nbytes: int) -> bool:
    """Ask the kernel to start writing the dirty pages of ``[offset, offset + nbytes)`` of
    ``fd`` to disk, without waiting (``sync_file_range(SYNC_FILE_RANGE_WRITE)``): a later
    fsync then finds less to do. Only a hint, never a durability point (no metadata, no
    disk cache flush): errors are left for that fsync to report. False where the call
    does not exist (then nothing happens early, and the fsync does all the work)."""
    if _SYNC_FILE_RANGE is None or nbytes <= 0:
        return False
    return _SYNC_FILE_RANGE(fd, offset, nbytes, SYNC_FILE_RANGE_WRITE) == 0


def pread_all(fd: int, n: int, offset: int) -> bytes:
    """Up to ``n`` bytes of ``fd`` from ``offset`` (fewer only at the end of the file)."""
    parts = []
    while n > 0:
        chunk = os.pread(fd, min(n, 1 << 26), offset)
        if not chunk:
            break
        parts.append(chunk)
        n -= len(chunk)
        offset += len(chunk)
    return b"".join(parts)


def pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    """Write all of ``view`` to ``fd`` at ``offset`` (``pread_all``'s twin for writes)."""
    while len(view):
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n
