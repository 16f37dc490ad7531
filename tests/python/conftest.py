import pytest

from testing_utils import generator


@pytest.fixture
def gen(request):
    """A torch.Generator seeded from the test's id (fresh random data per test, reproducible)."""
    return generator(request)
