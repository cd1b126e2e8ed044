"""A person approving a device sign-in over plain HTTP (urllib, a cookie jar, the page's forms):
for tests whose server is a process and whose program is not driven by a browser."""

from __future__ import annotations

import http.cookiejar
import re
import urllib.error
import urllib.request
from collections.abc import Callable
from html import unescape
from urllib.parse import urlencode, urljoin


class HttpPerson:
    def __init__(self, name: str = "alice", password: str = "wonderland", code: Callable[[], str] | None = None) -> None:
        self.name, self.password = name, password
        self.code = code  # the second factor's codes, for the page after the password
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
        self.url = ""
        self.html = ""
        self.status = 0

    def _go(self, request: urllib.request.Request) -> str:
        try:
            with self.opener.open(request, timeout=20) as resp:
                self.status, self.url, self.html = resp.status, resp.url, resp.read().decode()
        except urllib.error.HTTPError as exc:
            with exc:
                self.status, self.url, self.html = exc.code, exc.url, exc.read().decode()
        return self.html

    def open(self, url: str) -> str:
        return self._go(urllib.request.Request(url))

    def submit(self, button: int = 0, **fields: str) -> str:
        """The page's last form, sent by its `button`-th submit button."""
        form_html = self.html[self.html.rindex("<form"):]
        action = re.search(r'<form method="post" action="([^"]+)"', form_html)
        assert action is not None, form_html
        form = {unescape(n): unescape(v) for n, v in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', form_html)}
        name, value = re.findall(r'<button type="submit" name="([^"]+)" value="([^"]+)"', form_html)[button]
        form[name] = value
        form.update(fields)
        request = urllib.request.Request(urljoin(self.url, unescape(action.group(1))), data=urlencode(form).encode(), method="POST")
        request.add_header("Content-Type", "application/x-www-form-urlencoded")
        return self._go(request)

    def approve(self, url: str, user_code: str | None = None, *, allow: bool = True) -> str:
        """Open `url`, sign in when asked, type the code when asked, then allow (or deny)."""
        self.open(url)
        if 'type="password"' in self.html:
            self.submit(name=self.name, password=self.password)
        if "/account/second-step" in self.url:
            assert self.code is not None, self.html
            self.submit(code=self.code())
        if 'value="code"' in self.html:
            assert user_code is not None, self.html
            self.submit(user_code=user_code)
        assert self.status == 200 and 'value="allow"' in self.html, (self.status, self.html)
        return self.submit(0 if allow else 1)
