"""The page a chat message's "Acknowledge" button opens: it names the alert and the person the
page went to, and acknowledges only on its button (a POST), never on the visit itself — chat
tools fetch links to preview them."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_http_methods

from console.api.person_auth import audit_context
from core.errors import ServiceError
from incidents.notifications.replies import acknowledge_by_link, link_state, page_of_link


@require_http_methods(["GET", "POST"])
def acknowledge_link_page(request: HttpRequest, token: str) -> HttpResponse:
    try:
        delivery = page_of_link(token)
    except ServiceError as error:
        return render(request, "ack_link.html", {"error": error.detail}, status=error.status)
    context: dict[str, Any] = {
        "delivery": delivery,
        "alert": delivery.alert,
        "person": delivery.recipient,
    }
    if request.method == "POST":
        try:
            acknowledge_by_link(token, audit_context(request))
        except ServiceError as error:
            context["error"] = error.detail
            return render(request, "ack_link.html", context, status=error.status)
        context["done"] = True
        delivery.alert.refresh_from_db()  # type: ignore[union-attr]
    context["state"] = link_state(delivery)
    return render(request, "ack_link.html", context)
