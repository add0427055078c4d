import pytest


@pytest.fixture
def scene(db):
    """A team with a job and a person per role (the authorisation-chain tests)."""
    from tests.authz_support import make_scene  # Django models: not for -p no:django runs

    return make_scene()
