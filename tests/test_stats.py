"""`weightio.stats`: tensor statistics and checkpoint differences, for Python callers."""

from __future__ import annotations

import doctest
import math
import os

import numpy as np
import pytest

import weightio as wio
from weightio import stats

from .conftest import FIXTURES

BERT = FIXTURES / "models" / "bert"


def test_tensor_stats_of_a_fixture():
    with wio.open(FIXTURES / "tiny-bert") as ckpt:
        s = stats.tensor_stats(ckpt["embeddings.LayerNorm.bias"])
    assert (s.count, s.minimum, s.maximum, s.nan, s.inf, s.magnitude) == (32, -0.25, 0.75, 0, 0, False)
    assert s.mean == 0.220703125
    assert math.isclose(s.std, 0.2914740516799641, rel_tol=1e-12)


def test_tensor_stats_count_nan_and_inf_and_skip_them(tmp_path):
    values = np.array([[1.0, np.nan], [np.inf, -3.0], [-np.inf, 2.0]], dtype=np.float32)
    wio.save({"w": values, "i": np.array([5, -7, 2**40], dtype=np.int64)}, tmp_path / "a.safetensors")
    with wio.open(tmp_path / "a.safetensors") as ckpt:
        s = stats.tensor_stats(ckpt["w"])
        ints = stats.tensor_stats(ckpt["i"])
    assert (s.count, s.nan, s.inf, s.minimum, s.maximum, s.mean) == (6, 1, 2, -3.0, 2.0, 0.0)
    assert s.std == pytest.approx(math.sqrt(14 / 3))
    assert (ints.minimum, ints.maximum, type(ints.maximum)) == (-7, 2**40, int)


def test_chunks_and_first_values():
    with wio.open(FIXTURES / "tiny-bert") as ckpt:
        view = ckpt["encoder.layer.0.attention.self.query.weight"]  # (32, 32)
        assert [part.size for part in stats.chunks(view, 300)] == [288, 288, 288, 160]
        assert np.array_equal(np.concatenate(list(stats.chunks(view, 100))), view.numpy().reshape(-1))
        assert stats.first_values(view, 5).tolist() == view.numpy().reshape(-1)[:5].tolist()
        assert stats.first_values(ckpt["embeddings.LayerNorm.weight"], 3).tolist() == [-0.3125, -0.25, -0.1875]


def test_packed_tensors_have_no_statistics():
    with wio.open(FIXTURES / "packed_fp4.safetensors") as ckpt:
        view = ckpt["fp4"]
        assert stats.is_packed(view)
        with pytest.raises(wio.UnsupportedDTypeError, match="packs several elements per byte"):
            stats.tensor_stats(view)


def test_compare_two_tensors_with_tolerances():
    with wio.open(FIXTURES / "tiny-bert") as ckpt:
        a, b = ckpt["embeddings.LayerNorm.weight"], ckpt["embeddings.LayerNorm.bias"]
        strict = stats.compare(a, b)
        loose = stats.compare(a, b, atol=0.07)
        same = stats.compare(a, a)
    assert (strict.name, strict.equal, strict.max_abs, strict.mismatched, strict.count) == (
        "embeddings.LayerNorm.weight", False, 0.0625, 32, 32)
    assert (loose.equal, loose.mismatched) == (True, 0)
    assert (same.equal, same.max_abs, same.max_rel, same.type_changed) == (True, 0.0, 0.0, False)


def test_a_bad_tolerance_is_a_usage_error():
    with wio.open(FIXTURES / "tiny-bert") as ckpt:
        view = ckpt["pooler.dense.bias"]
        with pytest.raises(wio.UsageError, match="atol must be a number >= 0, got nan"):
            stats.compare(view, view, atol=float("nan"))
        with pytest.raises(ValueError, match="rtol must be a number >= 0, got -1"):
            stats.diff_checkpoints(ckpt, ckpt, rtol=-1)


def test_diff_of_a_bin_and_its_safetensors_is_equal():
    with wio.open(BERT / "pytorch_model.bin") as a, wio.open(BERT / "model.safetensors") as b:
        result = stats.diff_checkpoints(a, b)
    assert result.equal
    assert (len(result.pairs), result.only_a, result.only_b, result.renamed) == (39, [], [], {})
    assert all(d.equal and d.count > 0 for d in result.diffs)


def test_diff_reports_only_in_a_only_in_b_changed_and_different(tmp_path):
    base = {"same": np.arange(4, dtype=np.float32), "moved": np.ones(3, np.float32),
            "cast": np.array([1.0, 2.0], np.float32), "gone": np.zeros(2, np.float32)}
    other = {"same": np.arange(4, dtype=np.float32), "moved": np.array([1.0, 1.5, 0.0], np.float32),
             "cast": np.array([1.0, 2.0], np.float16), "new": np.zeros(1, np.int8)}
    wio.save(base, tmp_path / "a.safetensors")
    wio.save(other, tmp_path / "b.npz")
    with wio.open(tmp_path / "a.safetensors") as a, wio.open(tmp_path / "b.npz") as b:
        result = stats.diff_checkpoints(a, b)
        cast_only = stats.diff_checkpoints(a, b, patterns=["cast"], ignore_dtype=True)
    assert (result.only_a, result.only_b, result.equal) == (["gone"], ["new"], False)
    by_name = {d.name: d for d in result.diffs}
    assert by_name["same"].equal and not by_name["same"].type_changed
    moved = by_name["moved"]
    assert (moved.max_abs, moved.max_rel, moved.mismatched, moved.count) == (1.0, math.inf, 2, 3)
    cast = by_name["cast"]
    assert (cast.kinds, cast.equal, cast.type_changed, result.same(cast)) == (("float32", "float16"), True, True, False)
    assert cast_only.equal and list(cast_only.pairs) == ["cast"]


def test_single_tensor_files_pair_by_position(tmp_path):
    np.save(tmp_path / "w.npy", np.arange(3.0))
    np.save(tmp_path / "w2.npy", np.arange(3.0))
    with wio.open(tmp_path / "w.npy") as a, wio.open(tmp_path / "w2.npy") as b:
        result = stats.diff_checkpoints(a, b)
        assert result.equal and result.renamed == {list(a)[0]: list(b)[0]}


def test_the_module_is_documented_and_its_examples_run(monkeypatch):
    assert set(stats.__all__) <= set(dir(stats))
    monkeypatch.chdir(FIXTURES.parent)
    failed, attempted = doctest.testmod(stats, extraglobs={"wio": wio}, optionflags=doctest.ELLIPSIS)
    assert attempted > 10 and failed == 0
    assert os.getcwd() == str(FIXTURES.parent)
