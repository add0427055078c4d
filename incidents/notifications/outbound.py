"""Where a team's chat webhook may point: outside the console's own network.

A team admin sets the webhook URL; the console POSTs to it and records the answer. Without a
check that is a request forgery from inside the network (the console's own Redis, a cloud
metadata service, an internal admin page), with the answer shown back. So: http(s) only, and
every address the host resolves to must be a public one (no loopback, link-local, private,
shared, reserved, multicast or unspecified address), unless the operator allows them
(``BRAKELINE_NOTIFY_ALLOW_PRIVATE_URLS``, e.g. a chat server on the same private network).

The check runs when the policy is saved (a 400 naming the field) and again when a message is
sent: DNS can change in between, so the connection itself checks the address it reached, and
redirects are not followed.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import urllib.parse
import urllib.request
from typing import Any

from django.conf import settings


class RefusedURL(ValueError):
    """The URL may not be called; the message says why (fit for a 400 and a delivery row)."""


def private_allowed() -> bool:
    return bool(getattr(settings, "NOTIFY_ALLOW_PRIVATE_URLS", False))


def is_public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def check_url(url: str) -> None:
    """Raise RefusedURL unless ``url`` is http(s) and (unless allowed) resolves to public
    addresses only."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        raise RefusedURL("not a valid URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RefusedURL("must be an http:// or https:// URL with a host")
    if parts.username or parts.password:
        raise RefusedURL("must not carry a user name or password")
    if private_allowed():
        return
    host = parts.hostname
    try:
        infos = socket.getaddrinfo(host, port or 443, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        raise RefusedURL(f"the host {host!r} does not resolve") from None
    for info in infos:
        address = str(info[4][0])
        if not is_public(address):
            raise RefusedURL(
                f"the host {host!r} resolves to {address}, a loopback, link-local or private "
                "address (the operator may allow them: BRAKELINE_NOTIFY_ALLOW_PRIVATE_URLS)"
            )


def _checked_create_connection(address: Any, *args: Any, **kwargs: Any) -> socket.socket:
    sock = socket.create_connection(address, *args, **kwargs)
    peer = str(sock.getpeername()[0])
    if not private_allowed() and not is_public(peer):
        sock.close()
        raise RefusedURL(f"the host {address[0]!r} connected to {peer}, a non-public address")
    return sock


class _HTTPConnection(http.client.HTTPConnection):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._create_connection = _checked_create_connection


class _HTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._create_connection = _checked_create_connection


class _HTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req: urllib.request.Request) -> Any:
        return self.do_open(_HTTPConnection, req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def https_open(self, req: urllib.request.Request) -> Any:
        return self.do_open(_HTTPSConnection, req)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # the 3xx comes back as the answer: a webhook does not redirect


def opener() -> urllib.request.OpenerDirector:
    """An opener that connects to public addresses only (unless allowed), never redirects."""
    return urllib.request.build_opener(_HTTPHandler, _HTTPSHandler, _NoRedirect)
