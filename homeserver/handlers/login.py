"""GET /login (the flows) and POST /login (password login)."""

from __future__ import annotations

from typing import Any

from tornado.web import stream_request_body

from homeserver.errors import MatrixError
from homeserver.handlers.base import BaseHandler
from homeserver.jsonio import decode_json_object
from homeserver.login import login, login_outcome, parse_login


def too_large(limit: int) -> MatrixError:
    return MatrixError(413, "M_TOO_LARGE", f"Request body is larger than {limit} bytes")


@stream_request_body
class LoginHandler(BaseHandler):
    """Streams the body so an oversized one gets 413 M_TOO_LARGE without being buffered."""

    def prepare(self) -> None:
        self._chunks: list[bytes] = []
        self._size = 0
        self._limit = self.hs.max_body_size
        if self.request.method == "POST":
            length = self.request.headers.get("Content-Length", "")
            if length.isdigit() and int(length) > self._limit:
                raise too_large(self._limit)

    def data_received(self, chunk: bytes) -> None:
        self._size += len(chunk)
        if self._size <= self._limit:
            self._chunks.append(chunk)
        else:
            self._chunks.clear()  # chunked and too long: drop it, answer 413 at the end

    def get(self) -> None:
        self.finish(self.hs.documents.login_flows)

    async def post(self) -> None:
        metrics = self.hs.metrics
        try:
            response = await self._login()
        except Exception as exc:
            if metrics is not None:
                metrics.observe_login(login_outcome(exc))
            raise
        if metrics is not None:
            metrics.observe_login(login_outcome(None))
        self.write_json(response)

    async def _login(self) -> dict[str, str]:
        self.hs.limits.check_address(self.client_ip)
        if self._size > self._limit:
            raise too_large(self._limit)
        body: dict[str, Any] = decode_json_object(b"".join(self._chunks))
        request = parse_login(body, self.hs.server_name)
        return await login(
            request,
            users=self.hs.users,
            tokens=self.hs.tokens,
            checker=self.hs.checker,
            server_name=self.hs.server_name,
            limits=self.hs.limits,
        )


ROUTES = [
    (r"/_matrix/client/v3/login", LoginHandler),
]
