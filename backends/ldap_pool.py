"""The LDAP backend's connections: a thread pool, one connection per thread and job, StartTLS, retries."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

import ldap3
from ldap3.core.exceptions import LDAPException

from backends.base import StoreUnavailable
from backends.ldap_settings import LdapSettings

logger = logging.getLogger(__name__)

T = TypeVar("T")

# LDAP result codes (RFC 4511).
SUCCESS = 0
SIZE_LIMIT_EXCEEDED = 4
INVALID_CREDENTIALS = 49
# A user bind that fails with one of these is the directory in trouble, not a refusal.
TRANSIENT_RESULTS = {3, 11, 51, 52, 80}  # timeLimit, adminLimit, busy, unavailable, other


class DirectoryFault(Exception):
    """The directory could not be reached or answered with an error (inside a worker)."""


class _ConnectionLost(DirectoryFault):
    """The connection failed mid-operation; on a reused connection, worth one retry."""


class _Tls(ldap3.Tls):
    """ldap3's Tls with the standard library's certificate and host name checks.

    ldap3 2.9.1 turns off the SSL context's hostname check and uses its own fallback,
    which rejects IP-address SANs on Python 3.12+ and calls a deprecated API; a stock
    context with `server_hostname` does it right and sends SNI.
    """

    def __init__(self, context: ssl.SSLContext) -> None:
        super().__init__(validate=context.verify_mode)
        self.context = context

    def wrap_socket(self, connection: Any, do_handshake: bool = False) -> None:
        connection.socket = self.context.wrap_socket(
            connection.socket,
            server_side=False,
            do_handshake_on_connect=do_handshake,
            server_hostname=connection.server.host,
        )


def _tls_context(settings: LdapSettings) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=settings.ca_file or None)
    if not settings.tls_require_cert:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


class LdapPool:
    """Blocking ldap3 work on a thread pool of its own, bounded by the timeout.

    One service connection (searches, bound as bind_dn) and, in bind mode, one user-bind
    connection per worker thread: ldap3's SYNC connections are not thread-safe, so
    threads never share one. A broken connection is replaced, and a reused one that
    fails gets one retry on a fresh connection (a restarted directory, an idle timeout).
    """

    def __init__(self, settings: LdapSettings) -> None:
        self.settings = settings
        self.timeout = settings.timeout
        self._tls = _Tls(_tls_context(settings))
        self._targets = [urllib.parse.urlsplit(uri) for uri in settings.uris]
        # Each server gets an equal share of the timeout, so a list that tries every
        # server still answers within it.
        self._connect_timeout = settings.timeout / len(settings.uris)
        # ldap3 wants an integer here (a float breaks its struct.pack of SO_RCVTIMEO).
        self.receive_timeout = max(1, math.ceil(settings.timeout))
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=settings.pool_size, thread_name_prefix="ldap"
        )
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open_connections: set[ldap3.Connection] = set()

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            connections, self._open_connections = list(self._open_connections), set()
        for conn in connections:
            self._close_quietly(conn)

    async def run(self, fn: Callable[..., T], *args: Any, abandoned: Callable[[T], None] | None = None) -> T:
        """Run `fn` on the LDAP pool; StoreUnavailable if the directory fails or is slow.

        `abandoned` gets what `fn` returns when nobody waits for it any more: the wait timed
        out or was cancelled while the job ran on, and the job then succeeded (a directory
        that answered late), so what it opened can be closed."""
        try:
            future = self._executor.submit(fn, time.monotonic() + self.timeout, *args)
        except RuntimeError:  # pool shut down: the backend is closing
            raise StoreUnavailable("LDAP backend is shutting down") from None
        taken = False
        try:
            # The worker's own socket timeouts also fire, but a lookup is several
            # round trips: this bounds the whole of it, queueing included.
            result = await asyncio.wait_for(asyncio.wrap_future(future), self.timeout)
            taken = True
            return result
        # No logging here: the request handler logs every StoreUnavailable once.
        except TimeoutError:
            raise StoreUnavailable(f"LDAP directory did not answer within {self.timeout:g} s") from None
        except DirectoryFault as exc:
            raise StoreUnavailable(f"LDAP directory fault: {exc}") from None
        finally:
            if not taken and abandoned is not None:
                future.add_done_callback(partial(_give_back, abandoned))

    def with_connection(self, slot: str, deadline: float, op: Callable[[ldap3.Connection], T]) -> T:
        """Run `op` on this thread's connection in `slot`, replacing a broken one once.

        Slots: "service" (searches, bound as bind_dn) and "binder" (user binds).
        """
        conn = getattr(self._local, slot, None)
        if conn is not None and conn.closed:
            self._drop(slot, conn)
            conn = None
        reused = conn is not None
        if conn is None:
            conn = self._open_slot(slot)
        try:
            return self._attempt(slot, conn, op)
        except _ConnectionLost as lost:
            # A reused connection may simply be stale (directory restarted, idle
            # timeout); one retry on a new connection tells that from an outage.
            if not reused or time.monotonic() >= deadline:
                raise
            logger.info("LDAP connection lost (%s); reconnecting", lost)
        return self._attempt(slot, self._open_slot(slot), op)

    def _attempt(self, slot: str, conn: ldap3.Connection, op: Callable[[ldap3.Connection], T]) -> T:
        """Run `op` on `conn`; on any failure drop the connection and raise a DirectoryFault."""
        try:
            return op(conn)
        except DirectoryFault:
            self._drop(slot, conn)
            raise
        except (LDAPException, OSError) as exc:
            self._drop(slot, conn)
            raise _ConnectionLost(why(exc)) from None

    async def open_connection(self) -> ldap3.Connection:
        """A service connection of its own, not a thread's: for work that spans several jobs on
        whichever threads, one job at a time, such as a paged search, whose cookie is good on
        its connection only. Give it back with `release`. One opened after the wait for it
        ended (a timeout, a cancelled caller) is closed at once, not left open for good."""
        return await self.run(self._open_own, abandoned=self._forget)

    def _open_own(self, deadline: float) -> ldap3.Connection:
        return self._connect(service=True)

    def release(self, conn: ldap3.Connection) -> None:
        """Close a connection from `open_connection`, on a worker thread: a job that timed out
        may still hold it (ldap3 locks it for the operation), and the loop must not wait."""
        try:
            self._executor.submit(self._forget, conn)
        except RuntimeError:  # pool shut down: close() closed every open connection
            pass

    def _forget(self, conn: ldap3.Connection) -> None:
        with self._lock:
            self._open_connections.discard(conn)
        self._close_quietly(conn)

    def _open_slot(self, slot: str) -> ldap3.Connection:
        conn = self._connect(service=slot == "service")
        setattr(self._local, slot, conn)
        return conn

    def _connect(self, *, service: bool) -> ldap3.Connection:
        """Open a connection to the first server that answers (StartTLS, service bind)."""
        s = self.settings
        problems = []
        for target in self._targets:
            # A new Server object each time: ldap3 marks a Server's addresses unusable
            # for 5 s after one failed connect, which would delay recovery.
            server = ldap3.Server(
                target.hostname,
                port=target.port,
                use_ssl=target.scheme == "ldaps",
                tls=self._tls,
                connect_timeout=self._connect_timeout,
                get_info=ldap3.NONE,
            )
            conn = ldap3.Connection(
                server,
                client_strategy=ldap3.SYNC,
                receive_timeout=self.receive_timeout,
                raise_exceptions=False,
                read_only=True,
                # Referrals would send our credentials to hosts the operator never named.
                auto_referrals=False,
                check_names=False,
                return_empty_attributes=False,
            )
            try:
                conn.open(read_server_info=False)
                if s.start_tls and not server.ssl:
                    conn.start_tls(read_server_info=False)
                    if not conn.tls_started:  # never send a password in clear text
                        raise DirectoryFault(f"{server.host}: StartTLS failed: {conn.last_error}")
                if service and s.bind_dn and not self.simple_bind(conn, s.bind_dn, s.bind_password):
                    result = conn.result or {}
                    if result.get("result") == INVALID_CREDENTIALS:
                        logger.error("LDAP service bind as %r refused: check bind_dn and bind_password", s.bind_dn)
                    raise DirectoryFault(f"{server.host}: service bind failed: {describe(conn)}")
            except (LDAPException, OSError, DirectoryFault) as exc:
                self._close_quietly(conn)
                problems.append(f"{server.host}:{server.port}: {why(exc)}")
                continue
            with self._lock:
                self._open_connections.add(conn)
            return conn
        raise DirectoryFault("; ".join(problems))

    def simple_bind(self, conn: ldap3.Connection, dn: str, password: str) -> bool:
        """Bind as `dn`; refuse to send a password on a connection that lost its TLS."""
        # ldap3 silently reopens a closed connection on bind(), without StartTLS.
        if conn.closed or (self.settings.start_tls and not conn.server.ssl and not conn.tls_started):
            raise DirectoryFault("connection lost its TLS layer; not sending a password")
        conn.user, conn.password, conn.authentication = dn, password, ldap3.SIMPLE
        try:
            return bool(conn.bind(read_server_info=False))
        finally:
            conn.password = None  # keep no password in memory longer than the bind

    def _drop(self, slot: str, conn: ldap3.Connection) -> None:
        if getattr(self._local, slot, None) is conn:
            setattr(self._local, slot, None)
        with self._lock:
            self._open_connections.discard(conn)
        self._close_quietly(conn)

    @staticmethod
    def _close_quietly(conn: ldap3.Connection) -> None:
        """Unbind if possible and always close the socket (ldap3 leaks it when open fails)."""
        try:
            conn.unbind()
        except Exception:  # a broken socket: nothing to say goodbye on
            pass
        sock = getattr(conn, "socket", None)
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass


def _give_back(abandoned: Callable[[T], None], future: concurrent.futures.Future[T]) -> None:
    """Hand an abandoned job's result to `abandoned` (on the worker thread that ran it)."""
    if not future.cancelled() and future.exception() is None:
        abandoned(future.result())


def describe(conn: ldap3.Connection) -> str:
    result = conn.result or {}
    text = f"{result.get('description', 'no result')} ({result.get('result')})"
    if result.get("message"):
        text += f": {result['message']}"
    return text


def why(exc: BaseException) -> str:
    """One readable line for an exception (ldap3 wraps some messages in tuples)."""
    value: Any = exc.args[0] if exc.args else ""
    while isinstance(value, tuple) and value:
        value = value[0]
    return str(value) or type(exc).__name__
