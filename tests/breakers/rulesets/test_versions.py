"""Every change to a team's rule set is a new immutable version with who, when, why and a
diff; changes made outside the console are found and recorded; nothing is half-written."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction

from breakers.detection import rulesets
from breakers.models import Rule, RuleSetVersion
from core.append_only import AppendOnlyError
from core.errors import Forbidden, InvalidInput
from incidents.models import AuditEntry, Team
from tests.breakers.rulesets.conftest import disable

pytestmark = pytest.mark.django_db

SPIKE = {
    "name": "Grad norm spike",
    "layer": "stability",
    "metric": "grad_norm",
    "detector": "threshold",
    "params": {"above": 100.0},
    "severity": "L2",
    "action": "lower_lr",
    "action_params": {"factor": 0.5},
}


def test_the_first_read_records_version_1_and_each_change_a_new_version(crew):
    admin = crew.person("admin")
    first = rulesets.current_version(crew.team)
    assert (first.number, first.actor, first.why, first.summary) == (
        1,
        None,
        rulesets.FIRST_RECORDED,
        f"first recorded version ({Rule.objects.filter(team=None).count()} rules)",
    )
    assert rulesets.current_version(crew.team).pk == first.pk  # nothing changed: no new one

    second = rulesets.change_rules(admin, crew.team.pk, "too noisy on our data", disable())
    assert (second.number, second.actor, second.why) == (2, admin, "too noisy on our data")
    assert rulesets.describe_lines(second) == [
        "loss-deviation: enabled True → False; origin default → override"
    ]
    assert second.snapshot["rules"]["loss-deviation"]["enabled"] is False
    assert second.snapshot["braking"]["executor_grace_seconds"] == 10.0

    third = rulesets.change_rules(
        admin,
        crew.team.pk,
        "a spike detector",
        [
            {"op": "create", "key": "grad-spike", "fields": SPIKE},
            {"op": "update", "key": "loss-rising", "fields": {"params": {"window": 80}}},
        ],
    )
    assert third.number == 3
    assert rulesets.describe_lines(third) == [
        "grad-spike: added",
        "loss-rising: origin default → override; params.min_rise_se 2.0 → –; "
        "params.window 50 → 80; params.windows 5 → –",
    ]
    fourth = rulesets.change_rules(
        admin,
        crew.team.pk,
        "back to the pack",
        [{"op": "delete", "key": "loss-deviation"}, {"op": "delete", "key": "grad-spike"}],
    )
    assert rulesets.describe_lines(fourth) == [
        "grad-spike: removed",
        "loss-deviation: enabled False → True; origin override → default",
    ]
    assert list(Rule.objects.filter(team=crew.team).values_list("key", flat=True)) == [
        "loss-rising"
    ]
    ok = AuditEntry.objects.filter(action="edit_rules", allowed=True, user=admin)
    assert ok.count() == 3 and "v4" in ok.latest("at", "id").outcome


def test_a_failing_change_writes_nothing(crew):
    admin = crew.person("admin")
    rulesets.current_version(crew.team)
    with pytest.raises(InvalidInput) as refused:
        rulesets.change_rules(
            admin,
            crew.team.pk,
            "two at once",
            [
                {"op": "create", "key": "grad-spike", "fields": SPIKE},
                {"op": "update", "key": "loss-rising", "fields": {"params": {"windows": 0}}},
            ],
        )
    assert list(refused.value.fields) == ["changes[1].fields.params"]
    assert not Rule.objects.filter(team=crew.team).exists()
    assert RuleSetVersion.objects.filter(team=crew.team).count() == 1
    with pytest.raises(InvalidInput) as refused:
        rulesets.change_rules(admin, crew.team.pk, "  ", disable())
    assert list(refused.value.fields) == ["why"]
    with pytest.raises(InvalidInput) as refused:  # already enabled: no change, no version
        rulesets.change_rules(
            admin, crew.team.pk, "again", [{"op": "enable", "key": "loss-rising"}]
        )
    assert list(refused.value.fields) == ["changes"]
    assert RuleSetVersion.objects.filter(team=crew.team).count() == 1


@pytest.mark.parametrize("role", ["viewer", "oncall", "manager"])
def test_only_an_admin_changes_the_rules(crew, role):
    with pytest.raises(Forbidden, match="Only an admin may"):
        rulesets.change_rules(crew.person(role), crew.team.pk, "why not", disable())
    assert not Rule.objects.filter(team=crew.team).exists()
    refused = AuditEntry.objects.get(action="edit_rules", user=crew.person(role))
    assert (refused.allowed, refused.team_id) == (False, crew.team.pk)


def test_a_change_outside_the_console_is_recorded_by_the_system(crew, settings):
    rulesets.current_version(crew.team)
    settings.EXECUTOR_GRACE_SECONDS = 30.0  # a restart with a new BRAKELINE_EXECUTOR_GRACE_SECONDS
    Rule.objects.filter(team=None, key="loss-rising").update(severity="L2")  # SQL, or a migration
    version = rulesets.current_version(crew.team)
    assert (version.number, version.actor, version.why) == (2, None, rulesets.OUTSIDE_CHANGE)
    assert rulesets.describe_lines(version) == [
        "loss-rising: severity L3 → L2",
        "setting executor_grace_seconds: 10.0 → 30.0",
    ]
    # An admin's change made afterwards is diffed against the recorded state, not mixed into it.
    settings.EXECUTOR_GRACE_SECONDS = 20.0
    mine = rulesets.change_rules(crew.person("admin"), crew.team.pk, "noisy", disable())
    assert mine.number == 4 and rulesets.describe_lines(mine)[0].startswith("loss-deviation")


def test_a_default_pack_change_versions_every_team_it_changes(crew, admin_user):
    other = Team.objects.create(name="vision")
    rulesets.change_rules(
        crew.person("admin"),
        crew.team.pk,
        "ours",
        [{"op": "update", "key": "loss-rising", "fields": {"severity": "L2"}}],
    )
    versions = rulesets.change_default_pack(
        admin_user,
        "stricter pack",
        [
            {"op": "update", "key": "loss-rising", "fields": {"clear_after": 5}},
            {"op": "disable", "key": "throughput-drop"},
        ],
    )
    assert {v.team_id: rulesets.describe_lines(v) for v in versions} == {
        # the team's own loss-rising is not the pack's: only the other change reaches it
        crew.team.pk: ["throughput-drop: enabled True → False"],
        other.pk: ["loss-rising: clear_after 2 → 5", "throughput-drop: enabled True → False"],
    }
    with pytest.raises(Forbidden):
        rulesets.change_default_pack(crew.person("admin"), "not a superuser", disable())


def test_versions_are_append_only_for_the_model_the_queryset_and_the_database(crew):
    version = rulesets.current_version(crew.team)
    with pytest.raises(AppendOnlyError):
        version.save()
    with pytest.raises(AppendOnlyError):
        version.delete()
    with pytest.raises(AppendOnlyError):
        RuleSetVersion.objects.filter(pk=version.pk).update(why="nothing happened")
    for statement in (
        "UPDATE breakers_rulesetversion SET why = 'rewritten' WHERE id = %s",
        "DELETE FROM breakers_rulesetversion WHERE id = %s",
    ):
        refused = pytest.raises(IntegrityError, match="append-only")
        with refused, transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(statement, [version.pk])
    version.refresh_from_db()
    assert (version.why, RuleSetVersion.objects.count()) == (rulesets.FIRST_RECORDED, 1)


@pytest.mark.django_db(transaction=True)
def test_two_admins_saving_at_once_get_consecutive_versions_each_with_its_own_diff():
    """The team's row lock serialises them: v2 and v3, the second diffed against the first."""
    import threading

    from breakers.detection.rules import install_default_pack
    from tests.support.authz import make_member, make_scene

    install_default_pack()
    crew = make_scene()
    ana, bo = make_member(crew.team, "admin"), make_member(crew.team, "admin")
    rulesets.current_version(crew.team)
    start, errors = threading.Barrier(2), []

    def save(user, key):
        try:
            start.wait(timeout=30)
            rulesets.change_rules(user, crew.team.pk, f"{key} off", disable(key))
        except Exception as error:  # re-raised below, in the test's thread
            errors.append(error)
        finally:
            connection.close()

    threads = [
        threading.Thread(target=save, args=(ana, "loss-deviation")),
        threading.Thread(target=save, args=(bo, "loss-rising")),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    v2, v3 = RuleSetVersion.objects.filter(team=crew.team, number__gt=1).order_by("number")
    assert (v2.number, v3.number) == (2, 3)
    assert len(rulesets.describe_lines(v2)) == len(rulesets.describe_lines(v3)) == 1
    assert {v2.summary, v3.summary} == {"loss-deviation changed", "loss-rising changed"}
    assert v3.snapshot["rules"]["loss-deviation"]["enabled"] is False
    assert v3.snapshot["rules"]["loss-rising"]["enabled"] is False
