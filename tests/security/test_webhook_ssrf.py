"""Finding 1: a team admin pointed the chat webhook at an internal address and a viewer read
the internal answer in the alert's deliveries. Now: http(s) only, no loopback, link-local or
private address (checked at save time and again at send time), the answer truncated and shown
to admins only, the webhook URL itself a secret."""

from __future__ import annotations

import json
import socket

import pytest

from incidents.models import Delivery, NotificationPolicy
from incidents.notifications.delivery import attempt_delivery
from incidents.notifications.rounds import dispatch_alert
from tests.support.authz import raise_alert

SECRET = "internal-secret-answer " + "x" * 2000


def put(api, path: str, body: dict):
    return api.client.put(
        path, json.dumps(body), content_type="application/json", headers=api.headers
    )


@pytest.fixture
def internal(receiver):
    """An "internal service" on 127.0.0.1 whose answer must never reach a viewer."""
    receiver.plans["internal"] = [500]  # answers "try later": the body is what leaked
    return receiver


@pytest.mark.django_db
@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:{port}/internal",
        "http://localhost:{port}/internal",
        "http://[::1]:{port}/internal",
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.5/hook",
        "http://192.168.1.1/hook",
        "http://0.0.0.0:{port}/internal",
        "http://[::ffff:127.0.0.1]:{port}/internal",
        "file:///etc/passwd",
        "gopher://127.0.0.1:6379/_INFO",
        "ftp://example.com/x",
        "http://user:pw@example.com/x",
    ],
)
def test_a_webhook_url_to_an_internal_address_is_refused_at_save(scene, internal, settings, url):
    settings.NOTIFY_ALLOW_PRIVATE_URLS = False
    port = internal.url.rsplit(":", 1)[1]
    path = f"/api/v1/teams/{scene.team.pk}/notification-policy"
    response = put(scene.api("admin"), path, {"chat_webhook_url": url.format(port=port)})
    assert response.status_code == 400, response.content
    assert "chat_webhook_url" in response.json()["fields"]
    assert (
        not NotificationPolicy.objects.filter(team=scene.team).exclude(chat_webhook_url="").exists()
    )


@pytest.mark.django_db
def test_a_host_that_resolves_to_a_private_address_is_refused(scene, settings, monkeypatch):
    settings.NOTIFY_ALLOW_PRIVATE_URLS = False
    real = socket.getaddrinfo

    def fake(host, *args, **kwargs):
        if host == "chat.example.com":  # public-looking name, private answer (or rebinding)
            return [
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", 443)),
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.1.2.3", 443)),
            ]
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    path = f"/api/v1/teams/{scene.team.pk}/notification-policy"
    response = put(scene.api("admin"), path, {"chat_webhook_url": "https://chat.example.com/h"})
    assert response.status_code == 400
    assert "10.1.2.3" in response.json()["fields"]["chat_webhook_url"]


@pytest.mark.django_db
def test_an_internal_url_stored_earlier_is_refused_again_at_send(scene, internal, settings):
    """DNS can change after the save (or the row predates the check): nothing is sent."""
    settings.NOTIFY_ALLOW_PRIVATE_URLS = False
    NotificationPolicy.objects.filter(team=scene.team).update(
        chat_webhook_url=internal.url + "/internal"
    )
    alert = raise_alert(scene.job_id, "L2")
    (chat_id,) = dispatch_alert(alert.pk)
    assert attempt_delivery(chat_id) is None  # not retried: a refusal is final
    assert internal.requests == []
    delivery = Delivery.objects.get(pk=chat_id)
    assert delivery.status == "failed" and "refused" in delivery.provider_response


@pytest.mark.django_db
def test_viewers_see_neither_the_webhook_url_nor_the_providers_answer(scene, internal, settings):
    settings.NOTIFY_ALLOW_PRIVATE_URLS = True  # the operator allows the private chat server
    team = f"/api/v1/teams/{scene.team.pk}"
    admin, viewer = scene.api("admin"), scene.api("viewer")
    hook = internal.url + "/internal"
    assert put(admin, f"{team}/notification-policy", {"chat_webhook_url": hook}).status_code == 200
    assert admin.get(f"{team}/notification-policy").json()["chat_webhook_url"] == hook
    assert viewer.get(f"{team}/notification-policy").json()["chat_webhook_url"] == "(set)"
    alert = raise_alert(scene.job_id, "L2")
    (chat_id,) = dispatch_alert(alert.pk)
    attempt_delivery(chat_id)
    assert len(internal.requests) == 1
    rows = viewer.get(f"/api/v1/alerts/{alert.pk}/deliveries").json()
    assert rows[0]["provider_response"] == ""
    assert hook not in json.dumps(rows)
    (row,) = admin.get(f"/api/v1/alerts/{alert.pk}/deliveries").json()
    assert row["provider_response"].startswith("HTTP 500") and len(row["provider_response"]) < 400


@pytest.mark.django_db
def test_the_webhook_does_not_follow_redirects(scene, settings):
    """A public webhook answering 302 to an internal address: the redirect is not followed."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    hits: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            hits.append(self.path)
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(302)
            self.send_header("Location", "/internal")
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST  # noqa: N815

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        settings.NOTIFY_ALLOW_PRIVATE_URLS = True
        url = f"http://127.0.0.1:{server.server_address[1]}/hook"
        NotificationPolicy.objects.filter(team=scene.team).update(chat_webhook_url=url)
        alert = raise_alert(scene.job_id, "L2")
        (chat_id,) = dispatch_alert(alert.pk)
        attempt_delivery(chat_id)
        assert hits == ["/hook"]
        assert Delivery.objects.get(pk=chat_id).status == "failed"
    finally:
        server.shutdown()
        server.server_close()
