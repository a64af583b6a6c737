"""Credentials in an HTTP(S) URL (`http://user:password@host/x.tar`) used as the user meant them: sent as HTTP basic
authorization, with the userinfo taken out of the URL the client connects to (urllib would take `user:password@host`
for a host name). Everything eigtrain writes names the URL without them (eigtrain.redact)."""

from __future__ import annotations

import base64
from urllib.parse import unquote, urlsplit, urlunsplit
from urllib.request import Request


def http_request(url: str, method: str | None = None) -> Request:
    """A urllib request for `url`: its userinfo, if any, as an `Authorization: Basic` header."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return Request(url, method=method)
    userinfo, _, host = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    token = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode()
    request = Request(urlunsplit(parts._replace(netloc=host)), method=method)
    request.add_unredirected_header("Authorization", f"Basic {token}")  # not sent on to another host on a redirect
    return request
