"""Readiness grading, item by item (pure: runs with -p no:django)."""

import pytest

from breakers.snapshots.readiness import GiB, MiB, grade, size

GOOD = {
    "image": {"reference": "reg/train@sha256:" + "2" * 64, "pinned_by_digest": True},
    "seeds": {"python": 7, "torch": 7},
    "resources": {"scratch_free_bytes": 500 * GiB},
    "hardware": {"accelerators": [{"name": "A100", "memory_bytes": 80 * GiB}]},
    "sandbox": {
        "container": {"in_container": True, "evidence": ["/.dockerenv"]},
        "installers_in_command": [],
        "late_installed_packages": [],
        "cgroup": {"version": 2, "memory_max_bytes": 64 * GiB, "cpu_max_cpus": 8.0},
        "shm": {"total_bytes": 16 * GiB},
        "ulimits": {"memlock": {"soft": None}, "stack": {"soft": 8 * MiB}},
        "loader_workers": 4,
        "checkpoint_holds": {"saver": "brakeline", "seeds": True, "data_loader_state": True},
    },
}


def patched(path, value):
    """GOOD with one value replaced: patched("sandbox.shm.total_bytes", 64 * MiB)."""
    import copy

    doc = copy.deepcopy(GOOD)
    *parents, last = path.split(".")
    target = doc
    for name in parents:
        target = target[name]
    target[last] = value
    return doc


def test_a_clean_sandbox_is_ready():
    readiness = grade(GOOD)
    assert readiness.grade == "ready", [i for i in readiness.items if i.status != "ok"]
    assert readiness.pause_warnings == []
    assert {i.key: i.reason for i in readiness.items}["memory_limit"] == "64 GiB (cgroup v2)"


CASES = [
    # (what, document, item, status, words in the reason)
    (
        "tag, not digest",
        patched("image", {"reference": "reg/train:latest"}),
        "image",
        "fail",
        "reg/train:latest is a tag",
    ),
    (
        "no container at all",
        patched("sandbox.container", {"in_container": False}) | {"image": {}},
        "image",
        "na",
        "not in a container",
    ),
    (
        "container without a recorded image",
        {**GOOD, "image": {"reference": None}},
        "image",
        "warn",
        "in a container (/.dockerenv) whose image is not recorded",
    ),
    (
        "pip in the start command",
        patched("sandbox.installers_in_command", ["pip"]),
        "dependencies",
        "fail",
        "start-up command runs pip install",
    ),
    (
        "installed after start",
        patched("sandbox.late_installed_packages", [{"name": "einops"}, {"name": "wandb"}]),
        "dependencies",
        "fail",
        "2 package(s) installed after the container started: wandb, einops",
    ),
    (
        "many installed: the count, the most recent names",
        patched("sandbox.late_installed_packages", [{"name": f"p{i}"} for i in range(50)]) | {},
        "dependencies",
        "fail",
        "50 package(s) installed after the container started: p49, p48, p47, p46, p45 …",
    ),
    ("no seed", {**GOOD, "seeds": {}}, "seeds", "fail", "no seed set"),
    (
        "custom saver: seeds unknown",
        patched("sandbox.checkpoint_holds", {"saver": "custom", "seeds": None}),
        "seeds",
        "warn",
        "custom saver",
    ),
    (
        "no loader wrapped",
        patched("sandbox.checkpoint_holds.data_loader_state", False),
        "loader_state",
        "fail",
        "starts the data over",
    ),
    (
        "no memory limit",
        patched("sandbox.cgroup.memory_max_bytes", None),
        "memory_limit",
        "warn",
        "no memory limit (cgroup v2)",
    ),
    (
        "no cpu limit",
        patched("sandbox.cgroup.cpu_max_cpus", None),
        "cpu_limit",
        "warn",
        "no CPU limit",
    ),
    (
        "docker's 64 MiB shm, 4 workers",
        patched("sandbox.shm.total_bytes", 64 * MiB),
        "shm",
        "fail",
        "/dev/shm is 64 MiB; 4 loader workers need about 1 GiB",
    ),
    ("tiny shm, no workers", patched("sandbox.loader_workers", 0) | {}, "shm", "ok", "16 GiB"),
    (
        "scratch nearly full",
        patched("resources.scratch_free_bytes", 512 * MiB),
        "scratch",
        "fail",
        "512 MiB free",
    ),
    (
        "scratch low",
        patched("resources.scratch_free_bytes", 5 * GiB),
        "scratch",
        "warn",
        "5 GiB free",
    ),
    (
        "memlock 8 MiB",
        patched("sandbox.ulimits.memlock.soft", 8 * MiB),
        "ulimits",
        "warn",
        "memlock is 8 MiB",
    ),
    (
        "small stack",
        patched("sandbox.ulimits.stack.soft", 1 * MiB),
        "ulimits",
        "warn",
        "stack is 1 MiB",
    ),
    (
        "no accelerator",
        {**GOOD, "hardware": {"accelerators": []}},
        "accelerators",
        "na",
        "no accelerator visible",
    ),
]


@pytest.mark.parametrize(
    ("what", "doc", "key", "status", "words"), CASES, ids=[c[0] for c in CASES]
)
def test_each_item_grades_with_its_reason(what, doc, key, status, words):
    item = {i.key: i for i in grade(doc).items}[key]
    assert item.status == status
    assert words in item.reason


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        (GOOD, "ready"),
        (patched("sandbox.cgroup.cpu_max_cpus", None), "at risk"),
        (patched("sandbox.shm.total_bytes", 64 * MiB), "not ready"),
        (None, "unknown"),
        ({"schema": 1}, "not ready"),  # reports nothing: no seed is a failure, the rest unknown
    ],
)
def test_the_grade_is_the_worst_item(doc, expected):
    assert grade(doc).grade == expected


def test_pause_warnings_name_what_a_resume_relies_on():
    doc = patched("sandbox.checkpoint_holds.data_loader_state", False)
    doc["sandbox"]["cgroup"]["cpu_max_cpus"] = None  # not a pause concern
    warnings = grade(doc).pause_warnings
    assert len(warnings) == 1 and "starts the data over" in warnings[0]


@pytest.mark.parametrize(
    ("value", "text"),
    [(64 * MiB, "64 MiB"), (GiB, "1 GiB"), (1.5 * GiB, "1.5 GiB"), (300, "300 B")],
)
def test_sizes(value, text):
    assert size(value) == text


def test_the_count_of_late_installs_is_all_of_them_though_the_list_is_bounded():
    doc = patched("sandbox.late_installed_packages", [{"name": "a"}, {"name": "b"}])
    doc["sandbox"]["late_installed_count"] = 120
    reason = {i.key: i for i in grade(doc).items}["dependencies"].reason
    assert reason.startswith("120 package(s) installed after the container started: b, a …")


def test_an_inference_replica_is_restarted_not_resumed():
    doc = patched("sandbox.checkpoint_holds", {})
    doc["seeds"] = {}
    items = {i.key: i for i in grade(doc, "inference").items}
    assert items["seeds"].status == items["loader_state"].status == "na"
    assert grade(doc, "inference").grade == "ready"
    assert grade(doc).grade == "not ready"


def test_at_start_seeds_and_loader_are_graded_from_the_first_checkpoint():
    holds = {"saver": "brakeline", "seeds": False, "data_loader_state": False, "at": "start"}
    doc = patched("sandbox.checkpoint_holds", holds)
    doc["seeds"] = {}
    items = {i.key: i for i in grade(doc).items}
    assert items["seeds"].status == items["loader_state"].status == "unknown"
    assert "first checkpoint" in items["loader_state"].reason
    doc["sandbox"]["checkpoint_holds"]["at"] = "checkpoint"
    items = {i.key: i for i in grade(doc).items}
    assert items["seeds"].status == items["loader_state"].status == "fail"


def test_not_in_a_container_is_no_pause_warning():
    doc = patched("sandbox.container", {"in_container": False}) | {"image": {}}
    assert grade(doc).pause_warnings == []
