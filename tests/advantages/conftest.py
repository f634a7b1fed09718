"""Fixtures for the advantage tests."""

from __future__ import annotations

import pytest

from tests.advantages.adv_batches import random_batch


@pytest.fixture
def make_random():
    return random_batch
