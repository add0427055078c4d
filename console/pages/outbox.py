"""The Outbox page (``make demo``): what would have gone out by SMS, phone, chat and e-mail,
and the recipient's answer to a page (incidents.notifications.outbox)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from console.api.person_auth import audit_context, signed_in
from console.pages.forms import attempt, int_field
from incidents.notifications.outbox import answer_from_outbox, outbox, outbox_enabled
from incidents.teams.access import visible_team_ids


@login_required
def outbox_page(request: HttpRequest) -> HttpResponse:
    if not outbox_enabled():
        raise Http404("The Outbox is off: pages go to the real provider.")
    if request.method == "POST":
        delivery_id = int_field(request, "delivery_id") or 0
        attempt(
            request,
            "Acknowledged from the Outbox: the paging of this alert stops.",
            lambda: answer_from_outbox(signed_in(request), delivery_id, audit_context(request)),
        )
        return redirect("/outbox/")
    entries = outbox(signed_in(request), visible_team_ids(signed_in(request)))
    return render(request, "outbox.html", {"entries": entries})
