"""The snapshot diff core, table-driven (pure: runs with -p no:django)."""

import pytest

from breakers.snapshots.diff import describe_resume_change, diff_mappings, diff_snapshots

BASE = {
    "packages": {"torch": "2.12.0", "numpy": "1.26.4", "tqdm": "4.66.0"},
    "environment": {"HF_TOKEN": "<redacted>", "NCCL_DEBUG": "WARN", "OMP_NUM_THREADS": "8"},
    "seeds": {"python": 1, "torch": 1},
    "git": {"commit": "a" * 40, "dirty": False},
    "image": {"reference": "reg/train@sha256:" + "1" * 64, "pinned_by_digest": True},
    "data_position": {"epoch": 2, "batch_in_epoch": 10, "total_batches": 110},
    "hardware": {
        "accelerators": [{"name": "A100"}, {"name": "A100"}],
        "nvidia_driver": "550.54",
        "cuda": "12.4",
        "cudnn": "90100",
        "cpu_model": "EPYC",
    },
    "scheduler": {"hostname": "gpu-1", "pid": 10, "SLURM_JOB_ID": "7"},
    "python": {"version": "3.11.7"},
    "platform": {"system": "Linux"},
}


def with_(**sections):
    return {**BASE, **sections}


CASES = [
    # (what, after, group, expected changes as (key, change, before, after))
    (
        "package upgraded",
        with_(packages={**BASE["packages"], "torch": "2.13.0"}),
        "packages",
        [("torch", "changed", "2.12.0", "2.13.0")],
    ),
    (
        "package added and removed",
        with_(packages={"torch": "2.12.0", "numpy": "1.26.4", "einops": "0.8.0"}),
        "packages",
        [("einops", "added", None, "0.8.0"), ("tqdm", "removed", "4.66.0", None)],
    ),
    (
        "seed changed",
        with_(seeds={"python": 2, "torch": 1}),
        "seeds",
        [("python", "changed", 1, 2)],
    ),
    (
        "git dirty",
        with_(git={"commit": "a" * 40, "dirty": True}),
        "git",
        [("dirty", "changed", False, True)],
    ),
    (
        "image re-tagged",
        with_(image={"reference": "reg/train:latest"}),
        "image",
        [
            ("digest", "changed", "sha256:" + "1" * 64, None),
            ("reference", "changed", "reg/train@sha256:" + "1" * 64, "reg/train:latest"),
        ],
    ),
    (
        "loader restarted",
        with_(data_position={"epoch": 0, "batch_in_epoch": 0, "total_batches": 0}),
        "data_position",
        [
            ("batch_in_epoch", "changed", 10, 0),
            ("epoch", "changed", 2, 0),
            ("total_batches", "changed", 110, 0),
        ],
    ),
    (
        "driver and accelerator",
        with_(
            hardware={
                **BASE["hardware"],
                "nvidia_driver": "535.1",
                "accelerators": [{"name": "H100"}],
            }
        ),
        "hardware",
        [
            ("accelerators", "changed", "2× A100", "1× H100"),
            ("nvidia_driver", "changed", "550.54", "535.1"),
        ],
    ),
    (
        "new node, new pid: only the node counts",
        with_(scheduler={"hostname": "gpu-2", "pid": 99, "SLURM_JOB_ID": "7"}),
        "scheduler",
        [("hostname", "changed", "gpu-1", "gpu-2")],
    ),
    (
        "python",
        with_(python={"version": "3.12.1"}),
        "runtime",
        [("python.version", "changed", "3.11.7", "3.12.1")],
    ),
]


@pytest.mark.parametrize(("what", "after", "group", "expected"), CASES, ids=[c[0] for c in CASES])
def test_each_group_reports_what_changed(what, after, group, expected):
    diff = diff_snapshots(BASE, after)
    found = [
        (c.key, c.change, c.before, c.after)
        for c in diff.group(group).changes
        if c.change != "hidden"
    ]
    assert found == expected
    assert diff.changed_groups == [group]


def test_identical_snapshots_have_no_change_but_a_hidden_secret():
    diff = diff_snapshots(BASE, dict(BASE))
    assert diff.changed_groups == [] and diff.resume_critical == []
    hidden = diff.group("environment").changes
    # The token is redacted on both sides: said so, never shown, never counted as a change.
    assert [(c.key, c.change, c.after) for c in hidden] == [("HF_TOKEN", "hidden", "<redacted>")]


def test_a_secret_added_stays_redacted():
    after = with_(environment={**BASE["environment"], "WANDB_API_KEY": "<redacted>"})
    change = diff_snapshots(BASE, after).group("environment").changes
    assert ("WANDB_API_KEY", "added", "<redacted>") in [(c.key, c.change, c.after) for c in change]


@pytest.mark.parametrize(
    ("after", "critical"),
    [
        (with_(packages={**BASE["packages"], "torch": "2.13.0"}), ["packages"]),
        (with_(seeds={"python": 1}), ["seeds"]),
        (with_(image={"reference": "reg/train:v2"}), ["image"]),
        (with_(data_position=None), ["data_position"]),
        (with_(scheduler={"hostname": "gpu-9", "pid": 1}), []),  # another node: not critical
        (with_(environment={"NCCL_DEBUG": "INFO"}), []),
    ],
)
def test_resume_critical_groups(after, critical):
    assert diff_snapshots(BASE, after).resume_critical == critical


def test_a_section_missing_on_one_side_is_unknown_not_removed():
    older_agent = {k: v for k, v in BASE.items() if k not in ("hardware", "data_position")}
    diff = diff_snapshots(older_agent, BASE)
    assert not diff.group("hardware").known and not diff.group("hardware").changed
    assert not diff.group("data_position").known
    assert diff.changed_groups == []


def test_the_alerts_words():
    after = with_(
        packages={"torch": "2.13.0", "numpy": "2.0.0", "tqdm": "4.66.0", "a": "1", "b": "2"},
        seeds={"python": 3, "torch": 1},
    )
    words = describe_resume_change(diff_snapshots(BASE, after))
    assert words == ("packages (+a 1, +b 2, numpy 1.26.4 → 2.0.0, +1 more); seeds (python 1 → 3)")


def test_mappings_sort_case_insensitively():
    changes = diff_mappings({}, {"b": 1, "A": 2, "a": 3})
    assert [c.key for c in changes] == ["A", "a", "b"]
