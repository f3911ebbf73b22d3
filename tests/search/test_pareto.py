from __future__ import annotations

import pytest

from charon_search.search import hypervolume, non_dominated, normalized_hypervolume


def test_non_dominated_closed_form():
    pts = [[1, 5], [2, 2], [5, 1], [3, 3], [2, 2], [6, 6]]
    assert non_dominated(pts) == [0, 1, 2, 4]   # equal points both stay; (3,3), (6,6) dominated


def test_hypervolume_2d_staircase():
    # reference (6, 6): rectangles 5x1 + 4x3 + 1x1 from the staircase (1,5) (2,2) (5,1)
    assert hypervolume([[1, 5], [2, 2], [5, 1], [3, 3]], [6, 6]) == pytest.approx(5 + 12 + 1)
    assert hypervolume([[7, 1]], [6, 6]) == 0.0


def test_hypervolume_3d_box():
    assert hypervolume([[0, 0, 0]], [1, 2, 3]) == pytest.approx(6.0)
    assert hypervolume([[0, 0, 0], [0.5, 0.5, 0.5]], [1, 1, 1]) == pytest.approx(1.0)


def test_normalized_hypervolume_scales_to_unit_box():
    # one point at the ideal of a [0,10]x[0,100] box: (1.1)^2 after scaling
    assert normalized_hypervolume([[0, 0]], lower=[0, 0], upper=[10, 100]) == \
        pytest.approx(1.21)
