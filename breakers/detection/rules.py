"""The effective rule set of a job: the default pack, with its team's overrides and additions.

Rules are rows (``breakers.models.Rule``): team NULL for the default pack, a team's row with the
same key replaces the default rule for that team, a team's row with a new key adds one. One
small query per evaluation; rows are few (a dozen per team).
"""

from __future__ import annotations

import logging

from django.db.models import Q

from breakers.detection.engine import RuleSpec
from breakers.detection.rulepack import default_rules
from breakers.models import Rule
from incidents.models import Job

log = logging.getLogger(__name__)


def effective_rules(team_id: int | None) -> list[RuleSpec]:
    """The rules a job of ``team_id`` is evaluated with (disabled ones included, marked so).

    A row that is not a valid rule (edited in SQL, bypassing the admin's validation) is
    logged and left out rather than stopping the evaluation of every other rule.
    """
    rows = Rule.objects.filter(Q(team__isnull=True) | Q(team_id=team_id)).order_by("pk")
    by_key: dict[str, Rule] = {}
    for row in rows:
        # A team's row wins over the default row with the same key, whatever the order.
        if row.team_id is not None or row.key not in by_key:
            by_key[row.key] = row
    specs = []
    for key, row in by_key.items():
        try:
            specs.append(row.to_spec())
        except (ValueError, TypeError) as error:
            log.error(
                "breaker rule %s (row %s) is invalid and not evaluated: %s", key, row.pk, error
            )
    return specs


def rules_for_job(job_id: int) -> list[RuleSpec]:
    team_id = Job.objects.values_list("team_id", flat=True).get(pk=job_id)
    return effective_rules(team_id)


def install_default_pack(rule_model: type[Rule] = Rule) -> int:
    """Create the default pack's rows that are missing (team NULL); returns how many.

    Create-only: a default rule an admin has edited is left as it is. Migration 0004 calls it
    with its historical model; a later pack change ships as a migration calling it again.
    """
    # Only the columns the (possibly historical) model has: a RuleSpec field added later must
    # not break this migration on a fresh database.
    columns = {field.name for field in rule_model._meta.get_fields()}
    created = 0
    for spec in default_rules():
        fields = {name: value for name, value in spec.to_dict().items() if name in columns}
        key = fields.pop("key")
        created += rule_model.objects.get_or_create(team=None, key=key, defaults=fields)[1]
    return created
