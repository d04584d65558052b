"""The i-quant lattice tables (weightio/quant/grids.py) against ggml's, as the gguf package ships them."""

from __future__ import annotations

import numpy as np
import pytest

from weightio.quant import grids

# table -> (gguf.quants class, number of points, elements per point, allowed element values)
TABLES = {
    "IQ2XXS_GRID": ("IQ2_XXS", 256, 8, {8, 25, 43}),
    "IQ2XS_GRID": ("IQ2_XS", 512, 8, {8, 25, 43}),
    "IQ2S_GRID": ("IQ2_S", 1024, 8, {8, 25, 43}),
    "IQ3XXS_GRID": ("IQ3_XXS", 256, 4, {4, 12, 20, 28, 36, 44, 52, 62}),
    "IQ3S_GRID": ("IQ3_S", 512, 4, set(range(1, 16, 2))),
    "IQ1S_GRID": ("IQ1_S", 2048, 8, {-1, 0, 1}),
}


def _points(name: str) -> np.ndarray:
    _, count, width, _ = TABLES[name]
    words = np.array(getattr(grids, name), dtype=np.uint64 if width == 8 else np.uint32)
    dtype = np.int8 if name == "IQ1S_GRID" else np.uint8
    return words.astype(words.dtype.newbyteorder("<")).view(dtype).reshape(count, width)


@pytest.mark.parametrize("name", TABLES)
def test_table_shape_and_values(name):
    _, count, width, allowed = TABLES[name]
    points = _points(name)
    assert points.shape == (count, width)
    assert set(np.unique(points).tolist()) == allowed
    assert len({row.tobytes() for row in points}) == count  # a lattice lists each point once


def test_first_points_as_ggml_common_h_lists_them():
    # ggml-common.h: iq2xxs_grid = {0x0808080808080808, 0x080808080808082b, 0x0808080808081919, ...},
    # ... 0x2b2b2b0819190808, 0x2b2b2b1908081908}, iq3xxs_grid = {0x04040404, 0x04040414,
    # 0x04040424, 0x04040c0c, ...}, iq1s_grid = {0xffffffffffffffff, ...}
    assert grids.IQ2XXS_GRID[:3] == (0x0808080808080808, 0x080808080808082B, 0x0808080808081919)
    assert grids.IQ2XXS_GRID[-2:] == (0x2B2B2B0819190808, 0x2B2B2B1908081908)
    assert grids.IQ3XXS_GRID[:4] == (0x04040404, 0x04040414, 0x04040424, 0x04040C0C)
    assert grids.IQ1S_GRID[0] == 0xFFFFFFFFFFFFFFFF


@pytest.mark.parametrize("name", TABLES)
def test_tables_equal_the_gguf_package(name):
    gguf = pytest.importorskip("gguf")
    cls = getattr(gguf.quants, TABLES[name][0])
    cls.init_grid()
    expected = cls.grid.reshape(cls.grid_shape)
    np.testing.assert_array_equal(_points(name).astype(np.float32), expected)
