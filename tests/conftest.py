import pytest

from diskreplay.backends import BACKENDS


@pytest.fixture(params=BACKENDS)
def backend(request):
    """Every storage test runs against every backend."""
    return request.param
