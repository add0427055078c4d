"""``run.framework``: what a framework's integration reports to the run, and nothing else.

The integrations (Lightning, the Hugging Face Trainer) are tested through their frameworks in
test_integration_* and the framework matrix; here the interface they use is driven the way the
Trainer's callback drives it, hook by hook, and the SDK is checked for parts that reach into
another object's private attributes instead of asking for what they need.
"""

from __future__ import annotations

import ast
from pathlib import Path

import torch

from brakeline import ACK_LATER, PauseState
from brakeline._checkpoint import sha256_of

SDK = Path(__file__).resolve().parents[2] / "sdk" / "brakeline"
# A module's own private functions are part of the standard library's API, not of an object.
STANDARD_PRIVATE = {("os", "_exit")}


def _reaches_in(tree: ast.AST) -> list[str]:
    """``x._name`` (and ``x.__dict__``) where ``x`` is not ``self``: another object's insides."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        name = node.attr
        private = name.startswith("_") and not name.endswith("__")
        if not (private or name == "__dict__"):
            continue
        owner = node.value.id if isinstance(node.value, ast.Name) else None
        if owner == "self" or (owner, name) in STANDARD_PRIVATE:
            continue
        found.append((node.lineno, f"l. {node.lineno}: {ast.unparse(node)}"))
    return [text for _, text in sorted(found)]


def test_no_part_of_the_sdk_reaches_into_another_objects_private_attributes():
    reaching = {}
    for path in sorted(SDK.rglob("*.py")):
        found = _reaches_in(ast.parse(path.read_text(), str(path)))
        if found:
            reaching[str(path.relative_to(SDK))] = found
    assert reaching == {}


def test_the_scan_sees_what_it_forbids():
    source = "run._pause.refusal(3)\nrun.__dict__['x'] = 1\nself._guard.settle()\nos._exit(0)\n"
    assert _reaches_in(ast.parse(source)) == [
        "l. 1: run._pause",
        "l. 2: run.__dict__",
    ]


def _trained_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "checkpoint-3"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"weights at step 3")
    return folder


def test_a_brake_the_framework_saves_is_requested_handed_over_confirmed_and_held(
    make_run, transport, tmp_path
):
    run = make_run()
    model = torch.nn.Linear(2, 1)
    run.watch(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    run.framework.resumed_at(2)  # as after resume_from_checkpoint at step 2
    assert run.step == 2
    answers = []

    def request(r, command, step):
        answers.append(r.framework.request_save(command, step))
        return answers[-1]

    run.on_command("checkpoint_and_pause", request)
    run.inbox.offer({"id": 1, "kind": "checkpoint_and_pause"})
    run.step_boundary(3)  # the handler asks; the framework saves after this hook
    asked = run.framework.save_request
    assert asked is not None and asked.step == 3 and asked.command.id == 1
    assert run.pause_state is PauseState.SAVE_REQUESTED and answers == [ACK_LATER]
    # A second brake while the first waits for its save: acknowledged as already paused.
    assert run.framework.request_save(asked.command, 3) == {"step": 3, "already_paused": True}

    folder = _trained_folder(tmp_path)
    released = []
    run.on_release(lambda info: released.append(info.checkpoint))
    run.inbox.offer({"id": 2, "kind": "resume"})  # ends the hold the hand-over enters
    run.framework.checkpoint_and_pause(
        asked, 3, lambda: run.framework.checkpoint_written(str(folder), 3, asked)
    )
    [checkpoint] = released
    assert checkpoint.path == str(folder) and checkpoint.step == 3
    assert checkpoint.reason == "brake" and checkpoint.weights_step == 2
    assert checkpoint.sha256 == sha256_of(folder) and checkpoint.bytes == len(b"weights at step 3")
    assert run.framework.save_request is None and run.pause_state is PauseState.RUNNING
    acked = {a["id"]: a for a in run.acknowledgements}
    assert acked[1]["status"] == "succeeded" and acked[1]["result"]["path"] == str(folder)
    assert acked[2]["status"] == "succeeded"


def test_a_save_the_framework_skipped_still_pauses_and_reports_it(make_run):
    run = make_run()
    run.on_command("checkpoint_and_pause", lambda r, c, s: r.framework.request_save(c, s))
    run.inbox.offer({"id": 1, "kind": "checkpoint_and_pause"})
    run.step_boundary(3)
    assert run.framework.save_request is not None
    held = []
    run.on_command("isolate_node", lambda r, c, s: held.append(r.pause_state) or {})
    run.inbox.offer({"id": 2, "kind": "isolate_node"})  # applied inside the hold
    run.inbox.offer({"id": 3, "kind": "resume"})
    run.framework.save_skipped(4, "the Trainer did not save a checkpoint")
    assert held == [PauseState.HELD] and run.pause_state is PauseState.RUNNING
    acked = {a["id"]: a for a in run.acknowledgements}
    assert acked[1]["status"] == "failed" and acked[1]["result"] == {"step": 4, "paused": True}
    assert acked[1]["error"] == "the Trainer did not save a checkpoint"
