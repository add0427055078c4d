"""The SDK's world_size heartbeat field: from WORLD_SIZE (or Slurm's, MPI's), and never a
value the console would refuse (a refused heartbeat would cost the rank its liveness)."""

from __future__ import annotations

import pytest

from brakeline._state import world_size_field


@pytest.mark.parametrize(
    "environ, rank, expected",
    [
        ({"WORLD_SIZE": "4"}, 3, {"world_size": 4}),
        ({"WORLD_SIZE": " 2 "}, 0, {"world_size": 2}),
        ({}, 0, {}),
        ({"WORLD_SIZE": ""}, 0, {}),
        ({"WORLD_SIZE": "two"}, 0, {}),
        ({"WORLD_SIZE": "-1"}, 0, {}),
        ({"WORLD_SIZE": "0"}, 0, {}),
        ({"WORLD_SIZE": "2"}, 2, {}),  # not above the rank: the console would refuse it
        ({"WORLD_SIZE": str(2**31)}, 0, {}),
        # Other launchers: Slurm's srun, Open MPI, PMI; WORLD_SIZE first.
        ({"SLURM_NTASKS": "8"}, 0, {"world_size": 8}),
        ({"OMPI_COMM_WORLD_SIZE": "3"}, 1, {"world_size": 3}),
        ({"PMI_SIZE": "2"}, 1, {"world_size": 2}),
        ({"WORLD_SIZE": "4", "SLURM_NTASKS": "1"}, 3, {"world_size": 4}),
    ],
)
def test_world_size_comes_from_the_environment_when_usable(environ, rank, expected):
    assert world_size_field(environ, rank) == expected
