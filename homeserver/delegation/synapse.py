"""A client for Synapse's `/_synapse/mas/` API: the calls an authentication service makes.

Every call carries `Authorization: Bearer <shared secret>`, has a bounded time (connect
included) and a bounded answer. Synapse's refusals are classified here, once, into the
types callers test (never a status or an errcode):

- `SynapseUnreachable`: no answer, a 5xx, a malformed answer: worth retrying;
- `SynapseRefused`: a 4xx, retrying this call will not help; of which
  - `SynapseNotFound`: Synapse has no such user (or device);
  - `SynapseMisconfigured`: a wrong secret or no `/_synapse/mas/` API: every call fails
    alike until the operator mends it;
  - `SynapseBadName`: a user name Synapse does not take (M_INVALID_USERNAME).

A problem (wrong secret, Synapse down) is logged in one plain line when first seen, and
again only once it changes.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest, HTTPResponse

from homeserver.errors import M_INVALID_USERNAME, M_NOT_FOUND, M_UNRECOGNIZED

logger = logging.getLogger(__name__)

MAX_ANSWER_BYTES = 1 << 20
MAX_CONNECTIONS = 64


class SynapseError(Exception):
    """A call to Synapse that did not succeed."""

    def __init__(self, message: str, status: int | None = None, errcode: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.errcode = errcode


class SynapseUnreachable(SynapseError):
    """No answer in time, a connection refused, a 5xx or an answer that is not JSON."""


class SynapseRefused(SynapseError):
    """Synapse refused the call: a wrong secret, no /_synapse/mas API, a bad request."""


class SynapseNotFound(SynapseRefused):
    """404 M_NOT_FOUND: Synapse has no such user (or device)."""


class SynapseMisconfigured(SynapseRefused):
    """401/403 (the shared secret is not Synapse's) or no `/_synapse/mas/` API (404/405 or
    M_UNRECOGNIZED): every call fails alike, so a round of retries stops at the first."""


class SynapseBadName(SynapseRefused):
    """400 M_INVALID_USERNAME: a user name Synapse does not take (upper case, say)."""


class SynapseClient:
    """Calls Synapse's `/_synapse/mas/` API with the shared secret."""

    def __init__(
        self,
        synapse_url: str,
        secret: str,
        timeout: float = 5.0,
        observe: Callable[[str, str, float], None] | None = None,
    ) -> None:
        # observe(call, outcome, seconds): the metrics' hook (ok, not_found, refused, unreachable).
        self.observe = observe
        self.base = synapse_url.rstrip("/") + "/_synapse/mas/"
        self.synapse_url = synapse_url.rstrip("/")
        self.timeout = timeout
        self._auth = "Bearer " + secret
        self._http: AsyncHTTPClient | None = None
        self._problem: str | None = None

    def _client(self) -> AsyncHTTPClient:
        if self._http is None:
            # An instance of our own, on the running loop: its own connection limit.
            self._http = AsyncHTTPClient(
                force_instance=True, max_clients=MAX_CONNECTIONS, max_body_size=MAX_ANSWER_BYTES
            )
        return self._http

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None

    # -- the calls ------------------------------------------------------------------

    async def provision_user(
        self,
        localpart: str,
        *,
        display_name: str | None,
        avatar_url: str | None,
        emails: list[str],
        locked: bool | None = None,
    ) -> bool:
        """Create the user or update its profile (and its lock, unless None); True when created (201).

        Synapse keeps `locked` to leave the user out of its user directory; under delegation
        it refuses no token for it (introspection does).
        """
        body: dict[str, Any] = {"localpart": localpart}
        if display_name:
            body["set_displayname"] = display_name
        else:
            body["unset_displayname"] = True
        if avatar_url:
            body["set_avatar_url"] = avatar_url
        else:
            body["unset_avatar_url"] = True
        if emails:
            body["set_emails"] = emails
        else:
            body["unset_emails"] = True
        if locked is not None:
            body["locked"] = locked
        status, _ = await self._call("POST", "provision_user", body)
        return status == 201

    async def set_locked(self, localpart: str, locked: bool) -> None:
        """Only the user's lock (`provision_user` with nothing else: the profile stays)."""
        await self._call("POST", "provision_user", {"localpart": localpart, "locked": locked})

    async def upsert_device(self, localpart: str, device_id: str, display_name: str | None) -> bool:
        """Create the device or keep it (its keys stay); True when created (201)."""
        body: dict[str, Any] = {"localpart": localpart, "device_id": device_id}
        if display_name is not None:
            body["display_name"] = display_name
        status, _ = await self._call("POST", "upsert_device", body)
        return status == 201

    async def sync_devices(self, localpart: str, device_ids: list[str]) -> None:
        """Make the user's devices at Synapse exactly these (others deleted, missing ones made):
        how every end of a session reaches Synapse (no delete_device, whose device a login
        elsewhere may have just opened again)."""
        await self._call("POST", "sync_devices", {"localpart": localpart, "devices": sorted(set(device_ids))})

    async def update_device_display_name(self, localpart: str, device_id: str, display_name: str) -> None:
        await self._call(
            "POST",
            "update_device_display_name",
            {"localpart": localpart, "device_id": device_id, "display_name": display_name},
        )

    async def allow_cross_signing_reset(self, localpart: str) -> None:
        """Let the user replace their cross-signing master key without UIA for 10 minutes."""
        await self._call("POST", "allow_cross_signing_reset", {"localpart": localpart})

    async def deactivate_user(self, localpart: str) -> None:
        """Synapse's deactivation (`delete_user`, `erase: false`): the user leaves every room,
        loses their devices, tokens, e-mail addresses and push rules, and drops out of the user
        directory; the profile and the messages stay. Raises SynapseNotFound for a user it lacks."""
        await self._call("POST", "delete_user", {"localpart": localpart, "erase": False})

    async def reactivate_user(self, localpart: str) -> None:
        """Undo a deactivation (`reactivate_user`): active and in the user directory again; the
        rooms left are not rejoined. Raises SynapseNotFound for a user it lacks."""
        await self._call("POST", "reactivate_user", {"localpart": localpart})

    async def query_user(self, localpart: str) -> dict[str, Any]:
        """The user as Synapse has it: user_id, display_name, avatar_url, is_suspended, is_deactivated."""
        _, body = await self._call("GET", "query_user?" + urllib.parse.urlencode({"localpart": localpart}))
        return body

    # -- plumbing -------------------------------------------------------------------

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        if self.observe is None:
            return await self._send(method, path, body)
        name, started, outcome = path.partition("?")[0], time.perf_counter(), "unreachable"
        try:
            result = await self._send(method, path, body)
            outcome = "ok"
            return result
        except SynapseNotFound:
            outcome = "not_found"
            raise
        except SynapseRefused:
            outcome = "refused"
            raise
        finally:
            self.observe(name, outcome, time.perf_counter() - started)

    async def _send(self, method: str, path: str, body: dict[str, Any] | None) -> tuple[int, dict[str, Any]]:
        name = path.partition("?")[0]
        request = HTTPRequest(
            self.base + path,
            method=method,
            headers={"Authorization": self._auth, "Accept": "application/json", "Content-Type": "application/json"},
            body=None if body is None else json.dumps(body).encode(),
            connect_timeout=self.timeout,
            request_timeout=self.timeout,
            follow_redirects=False,
        )
        try:
            response = await self._client().fetch(request, raise_error=False)
        except HTTPClientError as exc:  # a timeout (599) or an answer over the size limit
            raise self._problem_seen(SynapseUnreachable(f"{name}: {exc}")) from None
        except OSError as exc:  # refused, reset, closed early
            raise self._problem_seen(SynapseUnreachable(f"{name}: {exc.strerror or exc!r}")) from None
        except Exception as exc:  # anything else on the way (a malformed answer's header, say)
            raise self._problem_seen(SynapseUnreachable(f"{name}: {exc!r}")) from None
        if response.code == 599 or (response.error is not None and response.code >= 500):
            raise self._problem_seen(SynapseUnreachable(f"{name}: {response.code} {_reason(response)}", response.code))
        answer = _json(response)
        if 200 <= response.code < 300:
            if answer is None:
                problem = f"{name}: {response.code} with a body that is no JSON object"
                raise self._problem_seen(SynapseUnreachable(problem))
            self._healthy()
            return response.code, answer
        errcode = answer.get("errcode") if answer else None
        error = answer.get("error") if answer else None
        text = f"{name}: {response.code} {errcode or ''} {error or _reason(response)}".replace("  ", " ")
        if response.code in (401, 403):
            raise self._problem_seen(SynapseMisconfigured(text, response.code, errcode), secret=True)
        if response.code == 404 and errcode == M_NOT_FOUND:
            self._healthy()
            raise SynapseNotFound(text, 404, errcode)
        if response.code in (404, 405) or errcode == M_UNRECOGNIZED:
            raise self._problem_seen(SynapseMisconfigured(text, response.code, errcode), api=True)
        if errcode == M_INVALID_USERNAME:
            raise SynapseBadName(text, response.code, errcode)
        raise SynapseRefused(text, response.code, str(errcode) if errcode else None)

    def _problem_seen(self, exc: SynapseError, *, secret: bool = False, api: bool = False) -> SynapseError:
        """Log the problem in one plain line when it is new (not at every call while it lasts)."""
        kind = "secret" if secret else "api" if api else "unreachable"
        if kind == self._problem:
            return exc
        self._problem = kind
        if secret:
            logger.error(
                "delegation: Synapse at %s refuses our secret (%s): delegation.secret must equal its "
                "matrix_authentication_service.secret",
                self.synapse_url,
                exc,
            )
        elif api:
            logger.error(
                "delegation: Synapse at %s has no /_synapse/mas/ API (%s): set matrix_authentication_service.enabled "
                "in its config (Synapse 1.136 or newer)",
                self.synapse_url,
                exc,
            )
        else:
            logger.warning("delegation: Synapse at %s cannot be reached (%s); retrying", self.synapse_url, exc)
        return exc

    def _healthy(self) -> None:
        if self._problem is not None:
            self._problem = None
            logger.info("delegation: Synapse at %s answers again", self.synapse_url)


def _reason(response: HTTPResponse) -> str:
    return response.reason or ("no answer" if response.code == 599 else "")


def _json(response: HTTPResponse) -> dict[str, Any] | None:
    """The answer as a JSON object; {} for an empty body (204); None for anything else."""
    raw = response.body or b""
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None
