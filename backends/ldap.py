"""LDAP user backend: users found by an escaped filter under a base DN, checked by hash or bind."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import os
import re
import ssl
import stat
import threading
import time
import unicodedata
import urllib.parse
import uuid
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

import ldap3
from ldap3.core.exceptions import LDAPException, LDAPInvalidFilterError
from ldap3.operation.search import parse_filter
from ldap3.utils.conv import escape_filter_chars

from backends.base import ConfigError, StoreDataError, StoreUnavailable, User, UserBackend

logger = logging.getLogger(__name__)

T = TypeVar("T")

ROLES = ("name", "display_name", "ident", "avatar_url", "password")
DEFAULT_ATTRIBUTES: dict[str, list[str]] = {
    "name": ["uid"],
    "display_name": ["displayName", "cn"],
    "ident": ["entryUUID"],
    "avatar_url": ["labeledURI"],
    "password": ["userPassword"],
}
# A Matrix user ID is at most 255 bytes, so a longer name can match nobody.
MAX_NAME_BYTES = 255
# RFC 2307 / OpenLDAP form of a bcrypt hash; the login rules want its hex text.
CRYPT_BCRYPT = re.compile(r"\{crypt\}(\$2[aby]\$.+)", re.IGNORECASE | re.DOTALL)
ATTRIBUTE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9-]*|[0-9]+(\.[0-9]+)+")

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


@dataclass(frozen=True, slots=True)
class LdapUser(User):
    """A user found in the directory, remembering its entry's DN for bind mode."""

    dn: str = ""


@dataclass(frozen=True)
class LdapSettings:
    """The validated `[backend.ldap]` section."""

    uris: list[str]
    base: str
    filter: str
    bind_dn: str
    bind_password: str
    mode: str
    timeout: float
    start_tls: bool
    ca_file: str
    tls_require_cert: bool
    pool_size: int
    attributes: dict[str, list[str]]


def _attribute_list(role: str, value: Any) -> list[str]:
    """Return an attribute mapping as a list of names; ConfigError for a bad name."""
    names = [value] if isinstance(value, str) else list(value)
    names = [n for n in names if n]
    for name in names:
        if not isinstance(name, str) or not ATTRIBUTE_NAME.fullmatch(name):
            raise ConfigError(f"backend.ldap.attributes.{role}: {name!r} is not an attribute name")
    return names


def _check_uri(uri: str) -> str:
    """Validate one LDAP URI and return it without the trailing '/' ldap3 rejects."""
    parts = urllib.parse.urlsplit(uri.strip())
    if parts.scheme.lower() not in ("ldap", "ldaps") or not parts.hostname:
        raise ConfigError(f"backend.ldap.uri: {uri!r} must look like ldap://host[:port] or ldaps://host[:port]")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise ConfigError(f"backend.ldap.uri: {uri!r} must name only a scheme, a host and a port")
    try:
        parts.port
    except ValueError:
        raise ConfigError(f"backend.ldap.uri: {uri!r} has a bad port") from None
    return f"{parts.scheme.lower()}://{parts.netloc}"


def _check_filter(text: str) -> str:
    """Parenthesise and syntax-check the operator's extra filter."""
    text = text.strip()
    if not text:
        return ""
    if not text.startswith("("):
        text = f"({text})"
    try:
        parse_filter(text, None, auto_escape=False, auto_encode=False, validator=None, check_names=False)
    except LDAPInvalidFilterError as exc:
        raise ConfigError(f"backend.ldap.filter: {text!r} is not a valid LDAP filter ({exc})") from None
    return text


def _read_password_file(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise ConfigError(f"backend.ldap.bind_password_file: {path} cannot be read ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"backend.ldap.bind_password_file: {path} is not UTF-8 text") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        logger.warning("backend.ldap.bind_password_file %s can be accessed by group or others; chmod 600 it", path)
    # Only the line ending an editor adds is dropped: a password may end in spaces.
    return text.removesuffix("\n").removesuffix("\r")


def parse_settings(options: dict[str, Any], config_dir: str) -> LdapSettings:
    """Check the section's combinations (the schema checked each key alone)."""
    uri = options.get("uri", "ldap://localhost:389")
    uris = [_check_uri(u) for u in ([uri] if isinstance(uri, str) else uri) if u.strip()]
    if not uris:
        raise ConfigError("backend.ldap.uri: must name at least one server")
    base = options.get("base", "").strip()
    if not base:
        raise ConfigError("backend.ldap.base: must name the DN under which users are searched")

    bind_dn = options.get("bind_dn", "")
    password = options.get("bind_password", "")
    password_file = options.get("bind_password_file", "")
    if password and password_file:
        raise ConfigError("backend.ldap: set bind_password or bind_password_file, not both")
    if password_file:
        if not os.path.isabs(password_file):
            password_file = os.path.join(config_dir, password_file)
        password = _read_password_file(password_file)
    # A simple bind with a DN and no password is an "unauthenticated bind": many servers
    # accept it as anonymous, which would hide a configuration mistake.
    if bind_dn and not password:
        raise ConfigError("backend.ldap.bind_dn: needs bind_password or bind_password_file")
    if password and not bind_dn:
        raise ConfigError("backend.ldap.bind_password: set bind_dn too")

    given = options.get("attributes", {})
    attributes = {role: _attribute_list(role, given.get(role, DEFAULT_ATTRIBUTES[role])) for role in ROLES}
    mode = options.get("mode", "hash")
    for role in ("name", "ident", "password") if mode == "hash" else ("name", "ident"):
        if not attributes[role]:
            raise ConfigError(f"backend.ldap.attributes.{role}: must name at least one attribute")

    ca_file = options.get("ca_file", "")
    if ca_file:
        ca_file = ca_file if os.path.isabs(ca_file) else os.path.join(config_dir, ca_file)
        if not os.path.isfile(ca_file):
            raise ConfigError(f"backend.ldap.ca_file: {ca_file} not found")

    return LdapSettings(
        uris=uris,
        base=base,
        filter=_check_filter(options.get("filter", "")),
        bind_dn=bind_dn,
        bind_password=password,
        mode=mode,
        timeout=float(options.get("timeout", 5.0)),
        start_tls=bool(options.get("start_tls", False)),
        ca_file=ca_file,
        tls_require_cert=bool(options.get("tls_require_cert", True)),
        pool_size=int(options.get("pool_size", 4)),
        attributes=attributes,
    )


def valid_name(name: str) -> bool:
    """Say whether a user-supplied name may be sent to the directory at all."""
    if not name or len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        return False
    try:
        name.encode("utf-8")  # lone surrogates cannot be sent
    except UnicodeEncodeError:
        return False
    # Control characters (NUL included) are never part of a name, and some LDAP
    # libraries mis-escape NUL: refuse them before any filter is built.
    return not any(unicodedata.category(ch) == "Cc" for ch in name)


def password_text(value: str) -> str:
    """Turn a stored `{CRYPT}$2b$...` into the hex text of the hash; anything else as is."""
    match = CRYPT_BCRYPT.fullmatch(value)
    return match.group(1).encode("utf-8").hex() if match else value


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


def _first_text(attrs: dict[str, list[bytes]], names: list[str], dn: str) -> str | None:
    """Return the first non-empty value of the first listed attribute that has one."""
    for name in names:
        for raw in attrs.get(name.lower(), []):
            if name.lower() == "objectguid" and len(raw) == 16:
                # Active Directory's objectGUID is 16 binary bytes in mixed-endian order.
                return str(uuid.UUID(bytes_le=bytes(raw)))
            try:
                text = bytes(raw).decode("utf-8")
            except UnicodeDecodeError:
                logger.warning("LDAP entry %s: attribute %s holds a value that is not UTF-8 (ignored)", dn, name)
                continue
            if text.strip():
                return text
    return None


class LdapBackend(UserBackend):
    """Users from an LDAP directory; passwords from its bcrypt hash or by binding as the user."""

    name = "ldap"

    def __init__(self, settings: LdapSettings) -> None:
        self.settings = settings
        self.timeout = settings.timeout
        self._tls = _Tls(_tls_context(settings))
        self._targets = [urllib.parse.urlsplit(uri) for uri in settings.uris]
        # Each server gets an equal share of the timeout, so a list that tries every
        # server still answers within it.
        self._connect_timeout = settings.timeout / len(settings.uris)
        # ldap3 wants an integer here (a float breaks its struct.pack of SO_RCVTIMEO).
        self._receive_timeout = max(1, math.ceil(settings.timeout))
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=settings.pool_size, thread_name_prefix="ldap"
        )
        # One service connection (and, in bind mode, one user-bind connection) per worker
        # thread: ldap3's SYNC connections are not thread-safe, so threads never share one.
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open_connections: set[ldap3.Connection] = set()
        attrs = settings.attributes
        wanted = attrs["name"] + attrs["display_name"] + attrs["ident"] + attrs["avatar_url"]
        if settings.mode == "hash":
            wanted += attrs["password"]
        self._wanted = list(dict.fromkeys(wanted))

    @classmethod
    def from_config(cls, options: dict[str, Any], *, config_dir: str) -> "LdapBackend":
        return cls(parse_settings(options, config_dir))

    # -- the UserBackend interface -----------------------------------------------------

    async def start(self) -> None:
        s = self.settings
        logger.info(
            "LDAP backend: %s, base %r, mode %s%s", ", ".join(s.uris), s.base, s.mode,
            ", StartTLS" if s.start_tls else "",
        )
        try:
            await self.check_health()
        except StoreUnavailable as exc:
            # Serve anyway: every lookup retries, so the service heals when the directory does.
            logger.warning("LDAP directory not usable at start-up (%s); retrying on each request", exc)

    async def get_user(self, name: str, *, case_insensitive: bool = False) -> User | None:
        if not valid_name(name):
            return None
        return await self._run(self._find_user, name, case_insensitive)

    async def verify_password(self, user: User, password: str) -> bool | None:
        if self.settings.mode != "bind":
            return None
        # An empty password would make an "unauthenticated bind", which succeeds.
        if not password:
            return False
        try:
            password.encode("utf-8")
        except UnicodeEncodeError:
            return False  # lone surrogates: no directory password can match
        dn = user.dn if isinstance(user, LdapUser) else ""
        if not dn:
            found = await self.get_user(user.name)
            if not isinstance(found, LdapUser):
                return False
            dn = found.dn
        return await self._run(self._bind_as, dn, password)

    async def check_health(self) -> None:
        await self._run(self._probe)

    async def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            connections, self._open_connections = list(self._open_connections), set()
        for conn in connections:
            self._close_quietly(conn)

    # -- running blocking ldap3 calls ----------------------------------------------------

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn` on the LDAP pool; StoreUnavailable if the directory fails or is slow."""
        try:
            future = self._executor.submit(fn, time.monotonic() + self.timeout, *args)
        except RuntimeError:  # pool shut down: the backend is closing
            raise StoreUnavailable("LDAP backend is shutting down") from None
        try:
            # The worker's own socket timeouts also fire, but a lookup is several
            # round trips: this bounds the whole of it, queueing included.
            return await asyncio.wait_for(asyncio.wrap_future(future), self.timeout)
        # No logging here: the request handler logs every StoreUnavailable once.
        except asyncio.TimeoutError:
            raise StoreUnavailable(f"LDAP directory did not answer within {self.timeout:g} s") from None
        except DirectoryFault as exc:
            raise StoreUnavailable(f"LDAP directory fault: {exc}") from None

    def _with_connection(self, slot: str, deadline: float, op: Callable[[ldap3.Connection], T]) -> T:
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
            raise _ConnectionLost(_why(exc)) from None

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
                receive_timeout=self._receive_timeout,
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
                if service and s.bind_dn and not self._simple_bind(conn, s.bind_dn, s.bind_password):
                    result = conn.result or {}
                    if result.get("result") == INVALID_CREDENTIALS:
                        logger.error("LDAP service bind as %r refused: check bind_dn and bind_password", s.bind_dn)
                    raise DirectoryFault(f"{server.host}: service bind failed: {_describe(conn)}")
            except (LDAPException, OSError, DirectoryFault) as exc:
                self._close_quietly(conn)
                problems.append(f"{server.host}:{server.port}: {_why(exc)}")
                continue
            with self._lock:
                self._open_connections.add(conn)
            return conn
        raise DirectoryFault("; ".join(problems))

    def _simple_bind(self, conn: ldap3.Connection, dn: str, password: str) -> bool:
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

    # -- work done on the pool's threads -----------------------------------------------

    def _name_filter(self, name: str) -> str:
        escaped = escape_filter_chars(name)
        matches = [f"({attr}={escaped})" for attr in self.settings.attributes["name"]]
        match = matches[0] if len(matches) == 1 else f"(|{''.join(matches)})"
        return f"(&{self.settings.filter}{match})" if self.settings.filter else match

    def _find_user(self, deadline: float, name: str, case_insensitive: bool) -> LdapUser | None:
        flt = self._name_filter(name)

        def search(conn: ldap3.Connection) -> list[dict[str, Any]]:
            conn.search(
                self.settings.base,
                flt,
                ldap3.SUBTREE,
                attributes=self._wanted,
                size_limit=2,  # two are enough to see the name is ambiguous
                time_limit=self._receive_timeout,
            )
            code = (conn.result or {}).get("result")
            if code not in (SUCCESS, SIZE_LIMIT_EXCEEDED):
                raise DirectoryFault(f"search under {self.settings.base!r} failed: {_describe(conn)}")
            return [r for r in conn.response or [] if r.get("type") == "searchResEntry"]

        entries = self._with_connection("service", deadline, search)
        if len(entries) != 1:
            if len(entries) > 1:
                logger.warning("LDAP: name %r matches several entries; refusing it", name)
            return None
        return self._entry_user(entries[0], name, case_insensitive)

    def _entry_user(self, entry: dict[str, Any], requested: str, case_insensitive: bool) -> LdapUser | None:
        """Build the User from an entry; None when no name value equals the requested one."""
        dn = entry.get("dn", "")
        attrs = {key.lower(): values for key, values in (entry.get("raw_attributes") or {}).items()}
        roles = self.settings.attributes

        names = []
        for attr in roles["name"]:
            for raw in attrs.get(attr.lower(), []):
                try:
                    names.append(bytes(raw).decode("utf-8"))
                except UnicodeDecodeError:
                    continue
        # The directory's matching rules also ignore extra spaces and more; keep only
        # an exact match, or a case-insensitive one when the caller asked for it.
        name = next((n for n in names if n == requested), None)
        if name is None and case_insensitive:
            name = next((n for n in names if n.casefold() == requested.casefold()), None)
        if name is None:
            return None
        # With several name attributes (log in by uid or mail), the stored name is the
        # first listed one that has a value, so the user ID does not depend on which was typed.
        primary = _first_text(attrs, roles["name"][:1], dn)
        if len(roles["name"]) > 1 and primary:
            name = primary

        ident = _first_text(attrs, roles["ident"], dn)
        if ident is None:
            raise StoreDataError(f"LDAP entry {dn}: no value for ident ({', '.join(roles['ident'])})")
        avatar = _first_text(attrs, roles["avatar_url"], dn)
        if avatar is not None:
            avatar = avatar.strip().split(" ", 1)[0]  # labeledURI is "URI [label]"
        password = None
        if self.settings.mode == "hash":
            for attr in roles["password"]:
                values = attrs.get(attr.lower(), [])
                if values:
                    # Not UTF-8 means not a hash we know; let the login rules report it.
                    password = password_text(bytes(values[0]).decode("utf-8", "replace"))
                    break
        return LdapUser(
            name=name,
            ident=ident,
            password=password,
            display_name=_first_text(attrs, roles["display_name"], dn),
            avatar_url=avatar or None,
            dn=dn,
        )

    def _bind_as(self, deadline: float, dn: str, password: str) -> bool:
        """Bind as the user on this thread's bind connection: True, False, or a fault."""

        def bind(conn: ldap3.Connection) -> bool:
            if self._simple_bind(conn, dn, password):
                return True
            code = (conn.result or {}).get("result")
            if code in TRANSIENT_RESULTS or code is None:
                raise DirectoryFault(f"bind as {dn!r} failed: {_describe(conn)}")
            if code != INVALID_CREDENTIALS:
                # Locked or expired accounts and the like: refused, but tell the operator why.
                logger.info("LDAP bind as %r refused: %s", dn, _describe(conn))
            return False

        return self._with_connection("binder", deadline, bind)

    def _probe(self, deadline: float) -> None:
        """Read the base entry: proves the connection, the service bind and the base DN."""

        def probe(conn: ldap3.Connection) -> None:
            conn.search(self.settings.base, "(objectClass=*)", ldap3.BASE, attributes=["1.1"], size_limit=1)
            if (conn.result or {}).get("result") != SUCCESS:
                raise DirectoryFault(f"base {self.settings.base!r} cannot be read: {_describe(conn)}")

        self._with_connection("service", deadline, probe)


def _describe(conn: ldap3.Connection) -> str:
    result = conn.result or {}
    text = f"{result.get('description', 'no result')} ({result.get('result')})"
    if result.get("message"):
        text += f": {result['message']}"
    return text


def _why(exc: BaseException) -> str:
    """One readable line for an exception (ldap3 wraps some messages in tuples)."""
    value: Any = exc.args[0] if exc.args else ""
    while isinstance(value, tuple) and value:
        value = value[0]
    return str(value) or type(exc).__name__
