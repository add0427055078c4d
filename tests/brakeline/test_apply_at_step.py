"""apply_at_step in the SDK: a command waits for its step and is applied exactly there; the
rank is named in the acknowledgement; the agreement stays out of runs without a process group.

The ranks' agreement itself runs in real torchrun + gloo processes
(test_integration_live_rank_sync.py, bench/ranks_sync.py).
"""

from __future__ import annotations

import threading

import pytest

from brakeline._commands import Command, CommandInbox
from brakeline._ranksync import RankAgreement


def command(command_id, kind="lower_lr", apply_at_step=None, **params):
    return {
        "id": command_id,
        "kind": kind,
        "params": params,
        "reason": "test",
        "apply_at_step": apply_at_step,
    }


@pytest.mark.parametrize(
    ("value", "parsed"),
    [(120, 120), (0, 0), (None, None), (-1, None), (True, None), ("120", None), (1.5, None)],
)
def test_apply_at_step_is_read_only_when_it_is_a_step(value, parsed):
    parsed_command = Command.from_json(command(1, apply_at_step=value))
    assert parsed_command is not None and parsed_command.apply_at_step == parsed


@pytest.mark.parametrize(
    ("apply_at", "step", "due"),
    [(None, 0, True), (10, 9, False), (10, 10, True), (10, 11, True)],
)
def test_a_command_is_due_from_its_step_on(apply_at, step, due):
    assert Command(id=1, kind="lower_lr", apply_at_step=apply_at).due(step) is due


def test_the_inbox_hands_out_due_commands_and_keeps_the_others():
    inbox = CommandInbox()
    inbox.offer(command(7, apply_at_step=20))
    inbox.offer(command(8, "isolate_node"))  # no step: due at once
    inbox.offer(command(9, apply_at_step=30))
    assert inbox.due_id(19) == 8 and inbox.due_id(20) == 8 and inbox.due_id(30) == 9
    assert inbox.take_due(19).id == 8
    assert inbox.take_due(19) is None and inbox.has_pending
    assert inbox.take_due(25).id == 7
    # What the ranks agreed on is applied even before its step (another rank was there).
    assert inbox.take_due(25, up_to=9).id == 9
    assert not inbox.has_pending


def test_without_a_process_group_a_command_is_applied_exactly_at_its_step(make_run):
    run = make_run()
    run.inbox.offer(command(5, "isolate_node", apply_at_step=12))
    seen = []
    run.on_command("isolate_node", lambda r, c, step: seen.append(step) or {})
    for step in range(1, 15):
        run.step_boundary(step)
    assert seen == [12]
    ack = run.acknowledgements[0]
    assert ack["result"]["apply_at_step"] == 12


def test_a_command_that_arrives_after_its_step_is_applied_at_once_and_says_so(make_run):
    run = make_run()
    seen = []
    run.on_command("isolate_node", lambda r, c, step: seen.append(step) or {"step": step})
    run.step_boundary(40)
    run.inbox.offer(command(6, "isolate_node", apply_at_step=30))
    run.step_boundary(41)
    assert seen == [41]
    # The console compares the ranks' steps: 41, not 30, is a split if another rank held at 30.
    assert run.acknowledgements[0]["result"] == {"step": 41, "apply_at_step": 30}


def test_a_rank_of_several_names_itself_in_its_acknowledgement(make_run, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    run = make_run(rank=2)
    run.inbox.offer(command(3, "resume"))
    run.step_boundary(1)
    assert run.acknowledgements[0]["result"]["rank"] == 2
    assert run.wait_for_ack(3)


def test_a_single_process_acknowledgement_is_unchanged(make_run):
    run = make_run()
    run.inbox.offer(command(4, "resume"))
    run.step_boundary(1)
    assert run.acknowledgements[0]["result"] == {"step": 1, "was_paused": False}


def test_no_process_group_no_agreement():
    # torch.distributed may be imported (other tests), but no group is initialised here.
    assert RankAgreement("auto").active() is False
    assert RankAgreement("on").active() is False
    assert RankAgreement("off").active() is False


@pytest.mark.parametrize(("mode", "every"), [("sometimes", 1), ("auto", 0)])
def test_agreement_settings_are_checked(mode, every):
    with pytest.raises(ValueError):
        RankAgreement(mode, every)


class AgreedElsewhere:
    """The ranks' agreement as another rank makes it: command ``agreed`` is due at ``at``.
    (The collective itself runs between real torchrun ranks in the live test and bench.)"""

    every = 1

    def __init__(self, agreed: int, at: int) -> None:
        self.agreed, self.at, self.offered = agreed, at, []

    def active(self) -> bool:
        return True

    def agree(self, step: int, due_id: int) -> tuple[int, int, int]:
        self.offered.append((step, due_id))
        return (max(due_id, self.agreed) if step >= self.at else due_id), step, step


def test_a_rank_waits_at_the_agreed_boundary_for_a_command_it_has_not_received(make_run):
    run = make_run()
    seen = []
    run.on_command("isolate_node", lambda r, c, step: seen.append(step) or {})
    run._commands.agreement = AgreedElsewhere(agreed=9, at=3)
    run.step_boundary(1)
    run.step_boundary(2)
    late = threading.Timer(0.3, run.inbox.offer, args=(command(9, "isolate_node", 3),))
    late.start()
    run.step_boundary(3)  # the other rank has it due here: this one waits for it, then applies
    late.join()
    assert seen == [3]
    assert run._commands.agreement.offered == [(1, 0), (2, 0), (3, 0)]


def test_with_an_agreement_a_due_command_waits_for_the_agreement_boundary(make_run):
    run = make_run()
    seen = []
    run.on_command("isolate_node", lambda r, c, step: seen.append(step) or {})
    agreement = AgreedElsewhere(agreed=0, at=0)
    agreement.every = 5
    run._commands.agreement = agreement
    run.inbox.offer(command(4, "isolate_node", apply_at_step=2))
    for step in range(1, 8):
        run.step_boundary(step)
    assert seen == [5]  # the first agreement boundary at or after its step
    assert agreement.offered == [(5, 4)]


def test_a_rank_that_never_gets_the_agreed_command_goes_on_without_it(make_run):
    run = make_run(agreement_wait_seconds=0.2)
    run._commands.agreement = AgreedElsewhere(agreed=9, at=1)
    run.step_boundary(1)  # waits 0.2 s, logs, goes on
    run.step_boundary(2)
    assert run.acknowledgements == []
