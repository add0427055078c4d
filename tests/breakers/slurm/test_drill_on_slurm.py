"""A fire drill whose sandbox runs on the real single-node Slurm: the drill workload is
submitted with ``sbatch --comment=brakeline:<job>``, the console binds the job to its Slurm job
from the heartbeats, and the NaN drill passes every scorecard line there too."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from breakers.models import DrillRun, DrillStatus, SchedulerBinding
from tests.breakers.slurm.conftest import requires_slurm
from tests.support.beat import running_beat

pytestmark = [requires_slurm, pytest.mark.django_db(transaction=True)]


def test_a_nan_drill_on_slurm_passes_every_line(slurm_cluster, live_console, worker, drill_team):
    out = io.StringIO()
    with running_beat():
        call_command(
            "drill",
            "--team",
            "research",
            "--scenario",
            "nan_loss",
            "--executor",
            "slurm",
            "--console-url",
            live_console,
            stdout=out,
        )
    run = DrillRun.objects.get(team=drill_team)
    assert run.status == DrillStatus.PASSED, out.getvalue()
    binding = SchedulerBinding.objects.get(job_id=run.job_id)
    assert binding.executor == "slurm" and binding.slurm_job_id
    assert "release" in out.getvalue() and "PASS" in out.getvalue()
