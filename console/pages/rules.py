"""A team's rules page: the rule set in force, drilled or not, its history with diffs, and —
for the team's admins — the forms that change it (``rulesets.change_rules``, as the API)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone

from breakers.detection import ruleset_core, rulesets, shadow
from breakers.detection.engine import ACTIONS, LAYERS, SEVERITIES
from breakers.detection.shadow_report import shadow_report
from console.api.person_auth import audit_context, signed_in
from console.pages.forms import attempt
from console.pages.teams import _team
from core.errors import InvalidInput
from incidents.reviews.durations import format_seconds
from incidents.teams.access import role_in_team
from incidents.teams.authority import Action, decide

HISTORY = 30
SHADOW_DAYS = 7
_TEXT = ("name", "metric", "runbook")
_CHOICE = ("layer", "detector", "severity", "action")
_FLAGS = ("per_node", "per_metric", "enabled", "shadow")


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _json_field(request: HttpRequest, name: str) -> Any:
    raw = request.POST.get(name, "").strip() or "{}"
    try:
        return json.loads(raw, parse_constant=_no_constant)
    except ValueError:
        raise InvalidInput(f"{name} is not valid JSON.", fields={name: "a JSON object"}) from None


def _number(request: HttpRequest, name: str, kind: type) -> Any:
    raw = request.POST.get(name, "").strip()
    try:
        return kind(raw)
    except ValueError:
        raise InvalidInput(f"Bad {name}.", fields={name: "a number"}) from None


def rule_from_form(request: HttpRequest) -> dict[str, Any]:
    """The rule form's fields, typed; the service checks them (and names what is wrong)."""
    fields: dict[str, Any] = {name: request.POST.get(name, "") for name in (*_TEXT, *_CHOICE)}
    fields.update({name: request.POST.get(name) == "on" for name in _FLAGS})
    fields["params"] = _json_field(request, "params")
    fields["action_params"] = _json_field(request, "action_params")
    fields["clear_after"] = _number(request, "clear_after", int)
    fields["clear_after_seconds"] = _number(request, "clear_after_seconds", float)
    # The recovery policy: left as it is when the form does not carry it.
    if "recovery" in request.POST:
        fields["recovery"] = request.POST["recovery"]
    if "recovery_budget" in request.POST:
        fields["recovery_budget"] = _number(request, "recovery_budget", int)
    return fields


def _change(request: HttpRequest) -> dict[str, Any]:
    op, key = request.POST.get("op", ""), request.POST.get("key", "").strip()
    if op in ("create", "update"):
        return {"op": op, "key": key, "fields": rule_from_form(request)}
    return {"op": op, "key": key}


def _post(request: HttpRequest, team_id: int) -> None:
    if request.POST.get("op") == "promote":
        _promote(request, team_id)
        return

    def change() -> None:
        rulesets.change_rules(
            signed_in(request),
            team_id,
            request.POST.get("why", ""),
            [_change(request)],
            context=audit_context(request),
        )

    attempt(request, "Rules changed: a new version is recorded below.", change)


def _promote(request: HttpRequest, team_id: int) -> None:
    def promote() -> None:
        shadow.promote_rule(
            signed_in(request),
            team_id,
            request.POST.get("key", "").strip(),
            request.POST.get("why", ""),
            context=audit_context(request),
        )

    attempt(request, "Rule promoted to live: a new version is recorded below.", promote)


def _shadow_figures(request: HttpRequest, team_id: int) -> dict[str, Any]:
    """The shadow rules' figures over the last ``SHADOW_DAYS`` days, as the page shows them."""
    until = timezone.now()
    report = shadow_report(request.user, team_id, until - timedelta(days=SHADOW_DAYS), until)
    for line in report["rules"]:
        line["lead"] = format_seconds(line["median_lead_seconds"])
    return {**report, "days": SHADOW_DAYS}


def _rows(snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for _, rule in sorted(snapshot["rules"].items(), key=lambda kv: (kv[1]["severity"], kv[0])):
        rows.append(
            {
                **rule,
                "params_json": ruleset_core.canonical_json(rule["params"]),
                "action_params_json": ruleset_core.canonical_json(rule["action_params"]),
            }
        )
    return rows


@login_required
def rules_page(request: HttpRequest, pk: int) -> HttpResponse:
    team = _team(request, pk)
    if request.method == "POST":
        _post(request, team.pk)
        return redirect(f"/teams/{team.pk}/rules/")
    badge = rulesets.drill_badge(team)
    versions = list(team.ruleset_versions.select_related("actor").order_by("-number")[:HISTORY])
    current = versions[0]
    context = {
        "team": team,
        "admin": decide(role_in_team(request.user, team.pk), Action.EDIT_RULES).allowed,
        "badge": badge,
        "version": current,
        "rules": _rows(current.snapshot),
        "braking": current.snapshot["braking"],
        "history": [{"v": v, "lines": rulesets.describe_lines(v)} for v in versions],
        "layers": LAYERS,
        "severities": SEVERITIES,
        "actions": ACTIONS,
        "detectors": ruleset_core.DETECTOR_KINDS,
        "shadow": _shadow_figures(request, team.pk),
    }
    return render(request, "rules.html", context)
