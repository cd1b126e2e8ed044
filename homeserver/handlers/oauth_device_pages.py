"""The page where a person approves a device sign-in (RFC 8628; HTML, under /account/ so the
account page's cookie and XSRF cookie reach it; no JavaScript). The device authorization
endpoint, which the program calls, is JSON: handlers/oauth_api.py.

The page's steps, each a form whose first submit button goes on: sign in (skipped by a person
signed in on the account page), type the code (skipped from `verification_uri_complete`),
then allow (the first button) or deny (the second). The codes are never logged.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlencode

from tornado.web import HTTPError

from homeserver.errors import PageError
from homeserver.handlers.page_base import PageHandler
from homeserver.oauth import OAuth
from homeserver.oauth.device import DeviceAuthorization, DeviceFlow, normalize, shown
from homeserver.oauth.metadata import VERIFICATION_PATH

logger = logging.getLogger(__name__)

# The audit trail's reason for a sign-in on the approval page.
AUDIT_REASON = "device sign-in"


class DevicePageHandler(PageHandler):
    """GET: the step the person is at. POST (XSRF checked): sign in, a code typed, allow or deny."""

    def flow(self) -> DeviceFlow:
        oauth: OAuth | None = self.hs.oauth
        if oauth is None:
            raise HTTPError(404)
        return oauth.device

    def show(self, step: str, status: int = 200, **values: Any) -> None:
        values.setdefault("user_code", "")
        values.setdefault("replaced", None)
        self.render_page(
            "oauth_device.html", status, step=step, path=VERIFICATION_PATH, title="Sign in a device", **values
        )

    async def found(self, typed: str) -> DeviceAuthorization | None:
        """The authorization a typed code names; None when the code step was shown again with
        what was wrong (unknown, expired, answered, too many tries)."""
        try:
            return await self.flow().find(typed, self.client_ip)
        except PageError as exc:
            self.show("code", problem=exc)
            return None

    async def code_step(self, typed: str) -> None:
        """The confirmation for a typed code, or the code step again with what was wrong."""
        found = await self.found(typed)
        if found is None:
            return
        record = found.record
        user = self.user
        replaced = await self.flow().grants.replaced(user.name, record["device_id"]) if user is not None else None
        self.show(
            "confirm", client_name=record["client_name"], client_uri=record.get("client_uri", ""),
            device_id=record["device_id"], replaced=replaced, user_code=shown(normalize(typed) or typed),
        )

    async def get(self) -> None:
        self.flow()
        typed = self.get_query_argument("user_code", "")
        if self.user is None or self.get_query_argument("prompt", "") == "login":  # "Not you?"
            self.show("sign_in", user_code=typed)
        elif typed:
            await self.code_step(typed)
        else:
            self.show("code")

    async def post(self) -> None:
        flow = self.flow()
        op = self.get_body_argument("op", "")
        typed = self.get_body_argument("user_code", "")
        if op == "sign_in":
            name = self.get_body_argument("name", "").strip()
            back = VERIFICATION_PATH + ("?" + urlencode({"user_code": typed}) if typed else "")
            try:
                user = await self.form_sign_in(name, self.get_body_argument("password", ""), AUDIT_REASON, back)
            except PageError as said:
                self.show("sign_in", problem=said, name=name, user_code=typed)
                return
            if user is None:
                return  # the second step's page is next; it comes back to the code
            if typed:
                await self.code_step(typed)
            else:
                self.show("code")
            return
        if self.user is None:
            self.show("sign_in", 401, error="Sign in to continue.", user_code=typed)
            return
        if op == "code":
            await self.code_step(typed)
            return
        if op not in ("allow", "deny"):
            self.show("code", 400)
            return
        found = await self.found(typed)
        if found is None:
            return
        allow = op == "allow"
        passed = self.browser_session.second_factor if self.browser_session is not None else ""
        if not await flow.decide(found, self.user, allow, self.client_ip, second_factor=passed):
            self.show("code", 409, error="That code was answered already, or it expired. Start again on your device.")
            return
        self.show("done", allowed=allow, client_name=found.record["client_name"], device_id=found.record["device_id"])


ROUTES = [
    (VERIFICATION_PATH, DevicePageHandler),
]
