"""The scorecard's "paged" line says whom the drill expected to reach: the team's drill
receivers (issue 19) or the on-call person, as the runner's paging facts tell it."""

from __future__ import annotations

from breakers.drills.scorecard import Facts, paging_line


def facts(receivers: bool, people: str) -> Facts:
    return Facts(
        paging={
            "policy": True,
            "receivers": receivers,
            "expected_channels": ["phone", "chat"],
            "expected_people": people,
            "paged_channels": ["chat", "phone"],
            "paged_people": people,
            "people_ok": True,
            "all_marked_drill": True,
            "failed": [],
        }
    )


def test_the_paged_line_names_the_drill_receivers_or_the_on_call_person():
    line = paging_line(facts(True, "carol, dave"))
    assert line.passed
    assert (
        line.expectation == "chat, phone to the team's drill receivers (carol, dave), marked DRILL"
    )
    line = paging_line(facts(False, "alice"))
    assert (
        line.passed
        and line.expectation == "chat, phone to the on-call person (alice), marked DRILL"
    )
    assert line.measured == "chat, phone to alice"


def test_with_nobody_on_call_the_paged_line_expects_the_managers():
    nobody = facts(False, "bob")
    nobody.paging["on_call"] = False
    line = paging_line(nobody)
    assert line.expectation == "chat, phone to the managers (nobody on call) (bob), marked DRILL"
