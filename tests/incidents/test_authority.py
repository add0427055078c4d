"""The authority matrix, cell by cell, written out independently of
incidents.teams.authority.MATRIX.

The expected table below is the specification; if the module's MATRIX drifts from it, the
cell's test fails. It is deliberately not derived from MATRIX (that would test nothing).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from incidents.teams import authority
from incidents.teams.authority import (
    SYSTEM,
    Action,
    Role,
    action_for_command,
    allowed_actions,
    decide,
    decide_on_escalation,
    matrix_markdown,
    role_at_least,
)

LEVELS = (None, "L1", "L2", "L3", "L4")
TEAM_ROLES = ("viewer", "oncall", "manager", "admin")
ACTORS = (None, *TEAM_ROLES, SYSTEM)

EVERYONE = "viewer oncall manager admin"
ONCALL_UP = "oncall manager admin"
MANAGER_UP = "manager admin"
ADMIN = "admin"
NOBODY = ""
# What on-call does with an incident besides acknowledging it (snooze, take, note).
HANDLING = {"snooze_alert", "assign_incident", "note_incident"}

# action -> {level: who may}; "*" is the default for levels not listed.
EXPECTED: dict[str, dict[str | None, str]] = {
    "view": {"*": EVERYONE},
    "acknowledge_alert": {"*": ONCALL_UP},
    "snooze_alert": {"*": ONCALL_UP},
    "assign_incident": {"*": ONCALL_UP},
    "note_incident": {"*": ONCALL_UP},
    "pause_job": {"*": ONCALL_UP, "L3": ONCALL_UP + " system"},
    "confirm_pause": {"*": MANAGER_UP, "L3": ONCALL_UP + " system", "L4": NOBODY},
    "request_escalation": {"*": NOBODY, "L1": ONCALL_UP, "L2": ONCALL_UP},
    "approve_escalation": {"*": MANAGER_UP},
    "reject_escalation": {"*": MANAGER_UP},
    "apply_mitigation": {"*": MANAGER_UP, "L2": MANAGER_UP + " system"},
    "resume_job": {"*": MANAGER_UP},
    "terminate_job": {"*": MANAGER_UP, "L4": MANAGER_UP + " system"},
    "isolate_node": {"*": MANAGER_UP, "L4": MANAGER_UP + " system"},
    "edit_review": {"*": ONCALL_UP},
    "create_job": {"*": MANAGER_UP},
    "manage_shifts": {"*": MANAGER_UP},
    "manage_silences": {"*": MANAGER_UP},
    "edit_rules": {"*": ADMIN},
    "run_drill": {"*": ADMIN},
    "manage_members": {"*": ADMIN},
    "manage_notifications": {"*": ADMIN},
}


def expected_allowed(action: str, level: str | None, actor: str | None) -> bool:
    who = EXPECTED[action].get(level, EXPECTED[action]["*"]).split()
    return actor in who


CELLS = [
    pytest.param(actor, action, level, id=f"{actor}-{action}-{level}")
    for action in EXPECTED
    for level in LEVELS
    for actor in ACTORS
]


def test_expected_table_covers_every_action() -> None:
    assert set(EXPECTED) == {action.value for action in Action}


@pytest.mark.parametrize(("actor", "action", "level"), CELLS)
def test_every_cell(actor: str | None, action: str, level: str | None) -> None:
    decision = decide(actor, action, level)
    assert decision.allowed is expected_allowed(action, level, actor), decision.reason
    assert decision.reason.endswith(".")
    assert (decision.action, decision.role, decision.level) == (action, actor, level)


@pytest.mark.parametrize(("actor", "action", "level"), CELLS)
def test_required_role_is_the_lowest_allowed_team_role(
    actor: str | None, action: str, level: str | None
) -> None:
    allowed_roles = [role for role in TEAM_ROLES if expected_allowed(action, level, role)]
    expected = allowed_roles[0] if allowed_roles else None
    assert decide(actor, action, level).required_role == expected


@pytest.mark.parametrize("action", list(EXPECTED))
@pytest.mark.parametrize("level", LEVELS)
def test_higher_roles_may_do_everything_lower_roles_may(action: str, level: str | None) -> None:
    marks = [decide(role, action, level).allowed for role in TEAM_ROLES]
    assert marks == sorted(marks), f"{action} at {level}: {marks}"


# ---- reasons: readable, and they say what is missing ------------------------------------------


@pytest.mark.parametrize(
    ("actor", "action", "level", "fragments"),
    [
        ("oncall", "resume_job", None, ["Only a manager or above", "resume a job", "on-call"]),
        ("viewer", "pause_job", "L2", ["Only an on-call engineer or above", "viewer"]),
        ("manager", "edit_rules", None, ["Only an admin may", "manager"]),
        ("oncall", "confirm_pause", "L1", ["on an L1 alert"]),
        ("oncall", "confirm_pause", "L3", ["An on-call engineer may confirm a pause on an L3"]),
        ("admin", "request_escalation", "L3", ["Nobody may", "already paused"]),
        ("admin", "confirm_pause", "L4", ["Nobody may", "terminated"]),
        (None, "view", None, ["no role in this team"]),
        (SYSTEM, "pause_job", "L3", ["The system may pause a job on an L3 alert automatically"]),
        (SYSTEM, "pause_job", "L2", ["The system may not pause a job on an L2 alert"]),
        (SYSTEM, "approve_escalation", "L2", ["The system may not approve"]),
    ],
)
def test_reason_says_why(
    actor: str | None, action: str, level: str | None, fragments: list[str]
) -> None:
    reason = decide(actor, action, level).reason
    for fragment in fragments:
        assert fragment in reason


def test_reason_mentions_level_only_where_it_matters_to_people() -> None:
    # terminate_job differs by level for the system only; a person is told no level.
    assert decide("oncall", "terminate_job", "L3").reason == (
        "Only a manager or above may terminate a job; your role in this team is on-call."
    )


# ---- nobody decides their own request ------------------------------------------------------


@pytest.mark.parametrize("role", ["manager", "admin"])
@pytest.mark.parametrize("action", ["approve_escalation", "reject_escalation"])
@pytest.mark.parametrize("level", LEVELS)
def test_own_request_is_refused(role: str, action: str, level: str | None) -> None:
    assert decide(role, action, level).allowed
    decision = decide(role, action, level, is_own_request=True)
    assert not decision.allowed
    assert "themselves" in decision.reason
    assert decision.required_role == "manager"


@pytest.mark.parametrize(
    ("requester_id", "decider_id", "allowed"),
    [
        (7, 8, True),
        (7, 7, False),
        ("7", 7, False),  # an id that arrives as text is still the same person
        (7, "7", False),
        ("alice", "alice", False),
        ("alice", "bob", True),
        (None, 7, True),  # no recorded requester: nobody's own request
    ],
)
@pytest.mark.parametrize("action", ["approve_escalation", "reject_escalation"])
def test_decide_on_escalation_compares_identities(
    action: str, requester_id: object, decider_id: object, allowed: bool
) -> None:
    decision = decide_on_escalation(
        "manager", action, requester_id=requester_id, decider_id=decider_id, level="L2"
    )
    assert decision.allowed is allowed


def test_decide_on_escalation_still_needs_the_role() -> None:
    decision = decide_on_escalation(
        "oncall", "approve_escalation", requester_id=1, decider_id=2, level="L2"
    )
    assert not decision.allowed
    assert decision.required_role == "manager"


@pytest.mark.parametrize(
    ("action", "decider_id"), [("pause_job", 2), ("request_escalation", 2), ("nope", 2)]
)
def test_decide_on_escalation_rejects_other_actions(action: str, decider_id: object) -> None:
    with pytest.raises(ValueError):
        decide_on_escalation("manager", action, requester_id=1, decider_id=decider_id)


def test_decide_on_escalation_needs_a_decider() -> None:
    with pytest.raises(ValueError, match="decider_id"):
        decide_on_escalation("manager", "approve_escalation", requester_id=1, decider_id=None)


def test_own_request_flag_does_not_touch_other_actions() -> None:
    assert decide("oncall", "pause_job", "L2", is_own_request=True).allowed


# ---- unknown inputs are programming errors, not silent denials ------------------------------


@pytest.mark.parametrize("role", ["owner", "Admin", "", "on-call", "System", 3])
def test_unknown_role_raises(role: object) -> None:
    with pytest.raises(ValueError, match="unknown role"):
        decide(role, "view")  # type: ignore[arg-type]


@pytest.mark.parametrize("action", ["delete_job", "View", "", "pause"])
def test_unknown_action_raises(action: str) -> None:
    with pytest.raises(ValueError, match="unknown action"):
        decide("admin", action)


@pytest.mark.parametrize("level", ["L0", "L5", "l3", "", "3"])
def test_unknown_level_raises(level: str) -> None:
    with pytest.raises(ValueError, match="unknown level"):
        decide("admin", "view", level)


def test_enum_members_are_accepted_like_their_values() -> None:
    decision = decide(Role.ONCALL, Action.PAUSE_JOB, authority.Level.L3)
    assert decision.allowed
    assert (decision.role, decision.action, decision.level) == ("oncall", "pause_job", "L3")
    assert type(decision.role) is str


# ---- role_at_least ---------------------------------------------------------------------------


@pytest.mark.parametrize("role", TEAM_ROLES)
@pytest.mark.parametrize("minimum", TEAM_ROLES)
def test_role_at_least_follows_the_order(role: str, minimum: str) -> None:
    expected = TEAM_ROLES.index(role) >= TEAM_ROLES.index(minimum)
    assert role_at_least(role, minimum) is expected


@pytest.mark.parametrize("minimum", TEAM_ROLES)
@pytest.mark.parametrize("role", [None, SYSTEM])
def test_no_role_and_system_have_no_rank(role: str | None, minimum: str) -> None:
    assert role_at_least(role, minimum) is False


@pytest.mark.parametrize("minimum", [SYSTEM, None, "owner"])
def test_role_at_least_needs_a_team_role_as_minimum(minimum: str) -> None:
    with pytest.raises(ValueError):
        role_at_least("admin", minimum)


def test_role_at_least_rejects_unknown_role() -> None:
    with pytest.raises(ValueError, match="unknown role"):
        role_at_least("owner", "viewer")


def test_role_values_are_exact() -> None:
    assert [role.value for role in authority.ROLE_ORDER] == list(TEAM_ROLES)
    assert SYSTEM == "system"
    assert SYSTEM not in {role.value for role in Role}


# ---- allowed_actions ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("actor", "level", "expected"),
    [
        (None, None, set()),
        (None, "L4", set()),
        ("viewer", None, {"view"}),
        ("viewer", "L3", {"view"}),
        (SYSTEM, None, set()),
        (SYSTEM, "L1", set()),
        (SYSTEM, "L2", {"apply_mitigation"}),
        (SYSTEM, "L3", {"pause_job", "confirm_pause"}),
        (SYSTEM, "L4", {"terminate_job", "isolate_node"}),
        (
            "oncall",
            "L3",
            {"view", "acknowledge_alert", "pause_job", "confirm_pause", "edit_review"} | HANDLING,
        ),
        (
            "oncall",
            "L2",
            {"view", "acknowledge_alert", "pause_job", "request_escalation", "edit_review"}
            | HANDLING,
        ),
        ("admin", None, {a.value for a in Action} - {"request_escalation"}),
    ],
)
def test_allowed_actions(actor: str | None, level: str | None, expected: set[str]) -> None:
    assert allowed_actions(actor, level) == expected


@pytest.mark.parametrize("actor", ACTORS)
@pytest.mark.parametrize("level", LEVELS)
def test_allowed_actions_agrees_with_the_table(actor: str | None, level: str | None) -> None:
    expected = {action for action in EXPECTED if expected_allowed(action, level, actor)}
    assert allowed_actions(actor, level) == expected


# ---- commands ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "action"),
    [
        ("lower_lr", "apply_mitigation"),
        ("pause_data", "apply_mitigation"),
        ("checkpoint_and_pause", "pause_job"),
        ("resume", "resume_job"),
        ("terminate", "terminate_job"),
        ("isolate_node", "isolate_node"),
    ],
)
def test_action_for_command(kind: str, action: str) -> None:
    assert action_for_command(kind) == action


def test_action_for_unknown_command_raises() -> None:
    with pytest.raises(ValueError, match="unknown command kind"):
        action_for_command("reboot")


# ---- the data cannot be changed at run time ---------------------------------------------------


def test_matrix_is_read_only() -> None:
    with pytest.raises(TypeError):
        authority.MATRIX[Action.VIEW] = authority.MATRIX[Action.EDIT_RULES]  # type: ignore[index]
    with pytest.raises(TypeError):
        authority.MATRIX[Action.EDIT_RULES].cells[None] = authority.Cell(Role.VIEWER)  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        decide("admin", "view").allowed = False  # type: ignore[misc]


def test_policy_without_a_cell_for_every_level_is_refused() -> None:
    with pytest.raises(ValueError, match="no cell"):
        authority.ActionPolicy("x", {None: authority.Cell(Role.ADMIN)}, "why")


# ---- the documentation is the code's output -------------------------------------------------

DOC = Path(__file__).resolve().parents[2] / "docs" / "authority-matrix.md"


def test_markdown_file_is_in_sync_with_the_matrix() -> None:
    assert DOC.read_text(encoding="utf-8") == matrix_markdown(), (
        "docs/authority-matrix.md is stale: run "
        "`python -m incidents.teams.authority > docs/authority-matrix.md`"
    )


def table_rows(markdown: str) -> list[list[str]]:
    rows = [line for line in markdown.splitlines() if line.startswith("| `")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]


def test_markdown_table_says_what_decide_says() -> None:
    names = {"none": None, "L1": "L1", "L2": "L2", "L3": "L3", "L4": "L4"}
    covered: set[tuple[str, str | None]] = set()
    for action_cell, levels_cell, *marks in table_rows(matrix_markdown()):
        action = action_cell.strip("`")
        levels = LEVELS if levels_cell == "any" else [names[n] for n in levels_cell.split(", ")]
        for level in levels:
            covered.add((action, level))
            for actor, mark in zip((*TEAM_ROLES, SYSTEM), marks, strict=True):
                assert mark == ("yes" if expected_allowed(action, level, actor) else "no")
    assert covered == {(action, level) for action in EXPECTED for level in LEVELS}


def test_the_role_order_has_one_home_and_the_model_follows_it():
    """The team role a membership stores (the model's choices) is the authority's, in its
    order; every ranking of roles (the audit page's refusal, role_at_least) reads ROLE_ORDER."""
    from incidents.models import Role as StoredRole
    from incidents.teams.authority import ROLE_ORDER, role_rank

    assert [role.value for role in StoredRole] == [role.value for role in ROLE_ORDER]
    assert [role_rank(role.value) for role in StoredRole] == list(range(len(ROLE_ORDER)))
    assert role_rank(None) == role_rank("system") == role_rank("owner") == -1
