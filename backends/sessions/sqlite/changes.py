"""The SQLite session store's change counter: what lets a process keep the sessions it read.

Checking a token's session is one SQLite read per request, and a read is far dearer inside
a busy server than it measures alone (~15-20 us of CPU under load against ~5 us in a
loop: it starts a read transaction, takes two file locks, walks two B-trees). The counter
lets a reader skip it while no session has ended: an 8-byte number in a file beside
the database (`<path>-changes`), mapped into the memory of every process that opens the
store, so reading it costs no system call.

It works as a seqlock:

- a writer that may end or remove a session (logout, revocation, the purge of tombstones),
  holding an exclusive lock on the counter's file (so such writers of all processes, and
  of all threads of one, take turns), makes the number odd before its transaction and
  even again after it commits or rolls back. The other writes leave it alone: a session
  opened (readers keep no absences), a last-seen touch, a rate-limit step, delegation
  marks change nothing a reader keeps, as Synapse invalidates only the key it changed;
- a reader that sees the same even number before and after its database read has read a
  state no transaction changed in between, and keeps it with that number;
- while the number still shows that value, no session has ended since: the kept session
  is the database's (but for its last-seen, which nothing read through the cache uses).
  Any other value (an end under way, or done) sends the reader back to the database.

A writer that dies mid-transaction leaves the number odd: readers then read the database
every time (correct, just slower) until the next end makes it even again. Every end
the service makes goes through the store and so through the counter; a change made to
the file by other means (the sqlite3 shell) is not seen by processes that kept the state
before it, until the next end through the store.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import struct
import threading
from collections.abc import Iterator

SIZE = 8
_FORMAT = struct.Struct("<Q")
# fcntl locks exclude processes, not the threads of one process: two stores on one file
# in a process (tests, a command run inside another program) take turns on this too.
_THREAD_LOCKS: dict[str, threading.Lock] = {}
_THREAD_LOCKS_GUARD = threading.Lock()


class ChangeCounter:
    """The shared counter of one session database (see the module's description)."""

    def __init__(self, database_path: str) -> None:
        # Beside the file itself, whatever name a process gives it (a symbolic link in one
        # config, the real path in a command): one file, one counter, as SQLite keeps one
        # journal for it.
        self.path = os.path.realpath(database_path) + "-changes"
        with _THREAD_LOCKS_GUARD:
            self._thread_lock = _THREAD_LOCKS.setdefault(self.path, threading.Lock())
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            if os.fstat(self._fd).st_size < SIZE:
                with self._locked():
                    if os.fstat(self._fd).st_size < SIZE:
                        os.ftruncate(self._fd, SIZE)
            self._map = mmap.mmap(self._fd, SIZE)
        except BaseException:
            os.close(self._fd)
            raise
        self._read = _FORMAT.unpack_from

    def value(self) -> int:
        """The number now: even while no transaction is under way."""
        return self._read(self._map, 0)[0]

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._thread_lock:
            fcntl.lockf(self._fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.lockf(self._fd, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Around a write transaction: odd while it runs, even (and higher) once it is over."""
        with self._locked():
            now = self.value()
            odd = now + 1 if now % 2 == 0 else now + 2  # odd already: a writer died mid-way
            _FORMAT.pack_into(self._map, 0, odd)
            try:
                yield
            finally:
                _FORMAT.pack_into(self._map, 0, odd + 1)

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)
