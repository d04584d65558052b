"""PyTorch checkpoints: torch-written fixtures in every container format, every tensor shape
torch writes, nested checkpoints, zero-copy views; differential tests against torch.load."""

from __future__ import annotations

import hashlib
import json
import mmap
import shutil
import zipfile

import ml_dtypes
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import weightio as wio
from weightio.errors import FormatError, UnsafePickleError, UnsupportedDTypeError
from weightio.formats.pytorch import PyTorchReader

from ..conftest import FIXTURES, digest, manifest
from ..pytorch_files import member, rezip

PT = FIXTURES / "pytorch"
RESNETS = ["resnet18_like.pth", "resnet18_like_legacy.pth"]
VIEWS = ["views.pt", "views_legacy.pt", "views_no_byteorder.pt"]


def _mapping_of(arr: np.ndarray) -> object:
    base = arr
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return base.obj if isinstance(base, memoryview) else base


def _check_manifest(ckpt, path: str) -> None:
    """Every tensor as the writing library recorded it (fixtures/manifest.json), names included."""
    specs = manifest()[path]
    assert sorted(ckpt) == sorted(specs)
    for name, spec in specs.items():
        view = ckpt[name]
        assert list(view.shape) == spec["shape"], name
        got = hashlib.sha256(view.raw().tobytes()).hexdigest() if spec["dtype"] == "F4" else digest(view.numpy())
        assert got == spec["sha256"], name


# ----------------------------------------------------------------------------- the case from the field


@pytest.mark.parametrize("name", RESNETS)
def test_resnet18_like_state_dict_reads_122_of_122_entries_bit_exact(name):
    with wio.open(PT / name) as ckpt:
        assert ckpt.format == "pytorch" and len(ckpt) == 122
        counters = [n for n in ckpt if n.endswith("num_batches_tracked")]
        assert len(counters) == 20
        assert all(ckpt[n].shape == () and ckpt[n].dtype == np.int64 for n in counters)
        assert ckpt["conv1.weight"].shape == (4, 3, 7, 7) and ckpt["fc.weight"].shape == (10, 32)
        _check_manifest(ckpt, f"pytorch/{name}")


@pytest.mark.parametrize("name", RESNETS)
def test_resnet18_like_needs_parameters_and_long_storages(name):
    # why loaders that know only _rebuild_tensor_v2 (40 entries) or no LongStorage (102) fall short
    assert set(wio.scan(PT / name).globals) == {
        "collections.OrderedDict", "torch._utils._rebuild_parameter", "torch._utils._rebuild_tensor_v2",
        "torch.FloatStorage", "torch.LongStorage"}


def test_zip_and_legacy_resnets_are_identical():
    with wio.open(PT / RESNETS[0]) as z, wio.open(PT / RESNETS[1]) as legacy:
        assert list(z) == list(legacy)
        for name in z:
            assert z[name].numpy().tobytes() == legacy[name].numpy().tobytes()


def test_sharded_pytorch_model_bin_directory_is_one_checkpoint():
    with wio.open(PT / "sharded") as sharded, wio.open(PT / RESNETS[0]) as single:
        assert sharded.format == "pytorch" and len(sharded.files) == 5
        index = json.loads((PT / "sharded" / "pytorch_model.bin.index.json").read_text())
        assert sharded.metadata["total_size"] == index["metadata"]["total_size"]
        for name, shard in index["weight_map"].items():
            assert sharded[name].path == str(PT / "sharded" / shard)
        assert sorted(sharded) == sorted(single)
        _check_manifest(sharded, "pytorch/sharded")


def test_a_directory_with_one_pytorch_model_bin_opens_it(tmp_path):
    shutil.copy(PT / RESNETS[0], tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text("{}")
    with wio.open(tmp_path) as ckpt:
        assert ckpt.files == [str(tmp_path / "pytorch_model.bin")] and len(ckpt) == 122


# ----------------------------------------------------------------------------- every tensor shape


@pytest.mark.parametrize("name", VIEWS)
def test_views_keep_their_offsets_and_strides(name):
    with wio.open(PT / name) as ckpt:
        base, info = ckpt["base"].numpy(), ckpt["base"].info
        assert info.strides is None
        assert ckpt["transposed"].info.strides == (4, 24)
        assert ckpt["columns"].info.strides == (24, 4) and ckpt["columns"].info.offset == info.offset + 4
        assert ckpt["rows_step"].info.strides == (48, 4)
        assert ckpt["tail"].info.offset == ckpt["every_third"].info.offset + 6 and ckpt["tail"].info.strides is None
        assert ckpt["every_third"].info.strides == (6,)
        assert ckpt["expanded"].info.strides == (0, 4)
        np.testing.assert_array_equal(ckpt["transposed"].numpy(), base.T)
        np.testing.assert_array_equal(ckpt["columns"].numpy(), base[:, 1:3])
        np.testing.assert_array_equal(ckpt["rows_step"].numpy(), base[::2])
        np.testing.assert_array_equal(ckpt["every_third"][1:], ckpt["tail"].numpy()[::3][:2])
        _check_manifest(ckpt, f"pytorch/{name}")


@pytest.mark.parametrize("name", VIEWS)
def test_names_sharing_a_storage_share_memory(name):
    with wio.open(PT / name) as ckpt:
        arrays = {n: ckpt[n].numpy() for n in ckpt}
        for other in ("transposed", "columns", "rows_step"):
            assert np.shares_memory(arrays["base"], arrays[other])
        assert np.shares_memory(arrays["tail"], arrays["every_third"])
        assert not np.shares_memory(arrays["base"], arrays["tail"])
        assert not np.shares_memory(arrays["scalar"], arrays["num_batches_tracked"])


def test_numpy_is_a_read_only_view_of_the_mapped_zip_record():
    with wio.open(PT / "views.pt") as ckpt:
        arr = ckpt["base"].numpy()
        assert np.shares_memory(arr, ckpt.readers[0].file.data)
        assert isinstance(_mapping_of(arr), mmap.mmap)
        assert arr.flags.writeable is False
        with pytest.raises(ValueError, match="read-only"):
            arr[0, 0] = 1
        assert ckpt["base"].info.offset % 64 == 0  # torch aligns records to 64 bytes


def test_scalars_empty_tensors_and_every_dtype():
    with wio.open(PT / "views.pt") as ckpt:
        assert ckpt["scalar"].shape == () and ckpt["scalar"].numpy() == 2.5
        assert ckpt["num_batches_tracked"].numpy() == 7 and ckpt["num_batches_tracked"].dtype == np.int64
        assert ckpt["empty"].shape == (0, 5) and ckpt["empty"].nbytes == 0
        assert ckpt["empty"].numpy().shape == (0, 5)
        assert ckpt["bfloat16"].dtype == np.dtype(ml_dtypes.bfloat16)
        assert ckpt["complex128"].dtype == np.complex128 and ckpt["bool"].dtype == np.bool_
        np.testing.assert_array_equal(ckpt["complex64"].numpy(), np.arange(3.0) - 1j * np.arange(3.0))
        np.testing.assert_array_equal(ckpt["bfloat16"].numpy().astype(np.float32), np.arange(6) / 4)


def test_parameters_and_tensors_with_python_attributes_are_plain_tensors():
    with wio.open(PT / "views.pt") as ckpt:
        assert "param" in ckpt and "tagged" in ckpt
        np.testing.assert_array_equal(ckpt["param"].numpy(), np.arange(3, dtype=np.float64))
        assert not any(k.startswith(("param.", "tagged.")) for k in ckpt.metadata)
    assert "torch._utils._rebuild_parameter_with_state" in wio.scan(PT / "views.pt").globals
    assert "torch._tensor._rebuild_from_type_v2" in wio.scan(PT / "views.pt").globals


def test_dtypes_torch_stores_as_untyped_storage_plus_dtype():
    with wio.open(PT / "new_dtypes.pt") as ckpt:
        assert ckpt["float8_e4m3fn"].dtype == np.dtype(ml_dtypes.float8_e4m3fn)
        assert ckpt["uint64"].dtype == np.uint64
        quarter = np.arange(-8, 8, dtype=np.float32) / 4
        assert ckpt["float8_e5m2"].numpy().tobytes() == quarter.astype(ml_dtypes.float8_e5m2).tobytes()
        np.testing.assert_array_equal(ckpt["f8_view"].numpy(), ckpt["float8_e4m3fn"].numpy().reshape(4, 4).T)
        fp4 = ckpt["fp4"]
        assert fp4.shape == (6,) and fp4.raw().tobytes() == bytes([0x21, 0x43, 0x65])
        with pytest.raises(UnsupportedDTypeError, match="tensor 'fp4': dtype F4 packs 2 elements per 1 byte"):
            fp4.numpy()
        _check_manifest(ckpt, "pytorch/new_dtypes.pt")


def test_big_endian_byteorder_record():
    with wio.open(PT / "big_endian.pt") as ckpt:
        assert ckpt["f32"].info.dtype == np.dtype(">f4") and ckpt["f32"].dtype == np.float32
        assert ckpt["c64"].info.dtype == np.dtype(">c8") and ckpt["u8"].info.dtype == np.uint8
        np.testing.assert_array_equal(ckpt["f32"].numpy(), np.arange(6, dtype=np.float32).reshape(2, 3) / 4)
        assert ckpt["f32"].raw().tobytes() == (np.arange(6, dtype=">f4") / 4).astype(">f4").tobytes()
        np.testing.assert_array_equal(ckpt["t"].numpy(), np.arange(6, dtype=np.int32).reshape(2, 3).T)
        _check_manifest(ckpt, "pytorch/big_endian.pt")


# ----------------------------------------------------------------------------- nested checkpoints


def test_nested_checkpoints_flatten_to_dotted_names_with_metadata_leaves():
    with wio.open(PT / "nested.pt") as ckpt:
        assert list(ckpt)[:6] == [f"model_state_dict.{i}.{p}" for i in (0, 1, 2) for p in ("weight", "bias")]
        assert "optimizer.state.0.exp_avg" in ckpt and "optimizer.state.5.exp_avg_sq" in ckpt
        assert ckpt["optimizer.state.0.step"].shape == () and ckpt["mean"].dtype == np.float32
        np.testing.assert_array_equal(ckpt["mean"].numpy(), np.arange(3, dtype=np.float32) / 2)
        meta = ckpt.metadata
        assert meta["epoch"] == 3 and meta["loss"] == 0.25 and meta["best_acc"] == 0.75 and meta["steps"] == 120
        assert meta["args.lr"] == 0.01 and meta["args.name"] == "run-7" and meta["args.layers"] == [4, 3, 2]
        assert meta["history"] == [0.5, 0.375, 0.25]
        assert meta["optimizer.param_groups.0.lr"] == 0.01 and meta["optimizer.param_groups.0.betas"] == [0.9, 0.999]
        assert meta["optimizer.param_groups.0.params"] == [0, 1, 2, 3, 4, 5]
        assert meta["optimizer.param_groups.0.foreach"] is None
        assert all(type(v) in (int, float, str, bool, list, type(None)) for v in meta.values())
        _check_manifest(ckpt, "pytorch/nested.pt")


def test_plain_pickles_of_numpy_arrays():
    for protocol in (2, 4):
        with wio.open(PT / f"numpy_weights_p{protocol}.pkl") as ckpt:
            assert ckpt.readers[0].container == "pickle"
            assert ckpt["fortran"].info.strides == (4, 8)
            assert ckpt["big_endian"].info.dtype == np.dtype(">i4")
            np.testing.assert_array_equal(ckpt["fortran"].numpy(), np.arange(6, dtype=np.int32).reshape(2, 3))
            _check_manifest(ckpt, f"pytorch/numpy_weights_p{protocol}.pkl")


# ----------------------------------------------------------------------------- containers


def test_legacy_tar_format():
    with wio.open(PT / "legacy_tar.pt") as ckpt:
        assert ckpt.readers[0].container == "tar"
        assert np.shares_memory(ckpt["fc.weight"].numpy(), ckpt["fc.weight_t"].numpy())
        assert ckpt["fc.weight_t"].info.strides == (4, 16)
        np.testing.assert_array_equal(ckpt["steps"].numpy(), [1, 2])
        _check_manifest(ckpt, "pytorch/legacy_tar.pt")


@pytest.mark.parametrize("protocol", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("kind", ["", "_legacy"])
def test_every_pickle_protocol_torch_save_writes(protocol, kind):
    with wio.open(PT / f"protocol{protocol}{kind}.pt") as ckpt:
        assert ckpt.readers[0].container == ("legacy" if kind else "zip")
        np.testing.assert_array_equal(ckpt["w"].numpy(), np.arange(6.0, dtype=np.float32).reshape(2, 3))
        _check_manifest(ckpt, f"pytorch/protocol{protocol}{kind}.pt")


def test_quantized_sparse_meta_and_numpy_less_dtypes_are_listed_but_not_read():
    with wio.open(PT / "special.pt") as ckpt:
        shapes = {n: (ckpt[n].shape, str(ckpt[n].info.dtype)) for n in ckpt}
        assert shapes == {"quantized": ((2, 3), "int8"), "quantized_per_channel": ((2, 3), "uint8"),
                          "sparse": ((3, 3), "float32"), "sparse_csr": ((3, 3), "float32"),
                          "meta": ((2, 5), "float32"), "complex32": ((2,), "|V4"), "dense": ((3,), "float32")}
        np.testing.assert_array_equal(ckpt["dense"].numpy(), np.arange(3.0))
        messages = {
            "quantized": "quantized tensor (torch.per_tensor_affine); weightio does not dequantize torch quantized "
                         "tensors — call .dequantize() in torch before saving",
            "quantized_per_channel": "quantized tensor (torch.per_channel_affine)",
            "sparse": "sparse tensor (torch.sparse_coo); numpy has no sparse layout — call .to_dense()",
            "sparse_csr": "sparse tensor (torch.sparse_csr)",
            "meta": "meta tensor: it has a shape but no data (saved from device='meta')",
            "complex32": "torch dtype complex32 has no numpy equivalent",
        }
        for name, message in messages.items():
            with pytest.raises(UnsupportedDTypeError) as info:
                ckpt[name].numpy()
            assert str(info.value).startswith(f"{PT / 'special.pt'}: tensor {name!r}: {message}")


def test_torchscript_archives_are_not_loaded():
    with pytest.raises(FormatError, match=r"is a TorchScript archive \(torch.jit.save\); TorchScript holds code and is "
                                          r"not loaded — save the module's state_dict\(\) with torch.save instead"):
        wio.open(PT / "torchscript.pt")
    with pytest.raises(FormatError, match="is a TorchScript archive"):
        PyTorchReader(PT / "torchscript.pt")  # the reader itself checks too, whatever sniffing said


@pytest.mark.parametrize("name,where", [("whole_module.pt", "whole_module/data.pkl"),
                                        ("whole_module_legacy.pt", "pickle 4 (the checkpoint)")])
def test_whole_module_pickles_are_refused(name, where):
    with pytest.raises(UnsafePickleError) as info:
        wio.open(PT / name)
    assert str(info.value) == (f"{PT / name}: {where}: the pickle asks for global "
                               "'torch.nn.modules.container.Sequential', which is not on weightio's allowlist; "
                               "nothing was imported or run (to read its tensors without running it, pass "
                               "unknown_globals='placeholder')")


def test_deflated_pickle_and_records_are_inflated_once(tmp_path):
    path = tmp_path / "deflated.pt"
    path.write_bytes(rezip(PT / "views.pt", {}, compress={"data.pkl", "views/data/0"}))
    with wio.open(path) as ckpt, wio.open(PT / "views.pt") as stored:
        for name in stored:
            assert ckpt[name].numpy().tobytes() == stored[name].numpy().tobytes()
        base = ckpt["base"].numpy()
        assert not np.shares_memory(base, ckpt.readers[0].file.data)  # inflated: a copy
        assert np.shares_memory(base, ckpt["transposed"].numpy())  # one buffer per record


@pytest.mark.parametrize("source,suffix", [("views.pt", ".safetensors"), ("views_legacy.pt", ".npz"),
                                           ("legacy_tar.pt", ".gguf"), ("numpy_weights_p4.pkl", ".bin")])
def test_sniffed_from_bytes_not_suffix(tmp_path, source, suffix):
    renamed = tmp_path / f"weights{suffix}"
    shutil.copy(PT / source, renamed)
    with wio.open(renamed) as ckpt:
        assert ckpt.format == "pytorch"


def test_reader_metadata_is_plain_and_container_is_reported():
    kinds = {"views.pt": "zip", "views_legacy.pt": "legacy", "legacy_tar.pt": "tar", "numpy_weights_p2.pkl": "pickle"}
    for name, kind in kinds.items():
        reader = PyTorchReader(PT / name)
        try:
            assert reader.container == kind and reader.metadata == {}
        finally:
            reader.close()


def test_records_come_from_local_headers_that_torch_pads(tmp_path):
    # torch writes the local header's extra field longer than the central directory's
    with zipfile.ZipFile(PT / "views.pt") as z:
        info = z.getinfo("views/data/0")
    with wio.open(PT / "views.pt") as ckpt:
        data_offset = ckpt["base"].info.offset
    raw = (PT / "views.pt").read_bytes()
    local_extra = int.from_bytes(raw[info.header_offset + 28: info.header_offset + 30], "little")
    assert local_extra != len(info.extra)
    assert data_offset == info.header_offset + 30 + len("views/data/0") + local_extra
    assert raw[data_offset: data_offset + 8] == member(PT / "views.pt", "data/0")[:8]


# ----------------------------------------------------------------------------- differential: torch


def _torch_leaves(obj, prefix=""):
    """(dotted name, tensor or ndarray) the way weightio flattens, from torch.load's object."""
    import argparse

    import torch

    if isinstance(obj, torch.Tensor) and obj.is_nested:  # weightio lists a nested tensor's components
        for i, part in enumerate(obj.unbind()):
            yield f"{prefix}[{i}]", part
    elif isinstance(obj, (torch.Tensor, np.ndarray)):
        yield prefix, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _torch_leaves(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(obj, argparse.Namespace):
        yield from _torch_leaves(vars(obj), prefix)
    elif isinstance(obj, (list, tuple)) and any(isinstance(v, (torch.Tensor, np.ndarray, dict, list)) for v in obj):
        for i, v in enumerate(obj):
            yield from _torch_leaves(v, f"{prefix}.{i}" if prefix else str(i))


def _torch_load(path):
    import torch

    try:
        return torch.load(path, weights_only=True)
    except Exception:  # protocols 1, 4, 5, the tar format, numpy arrays: weights_only refuses them.
        return torch.load(path, weights_only=False)  # These are trusted fixtures torch wrote itself.


PYTORCH_FIXTURES = sorted(p for p in manifest() if p.startswith("pytorch/") and p.endswith((".pt", ".pth")))


def _bytes_of(t) -> bytes:  # noqa: ANN001
    """A torch tensor's elements in C order as bytes (any dtype, any strides, 0-d included)."""
    import torch

    return torch.empty(t.shape, dtype=t.dtype).copy_(t).reshape(-1).view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize("path", PYTORCH_FIXTURES)
def test_every_tensor_matches_torch_load_bit_for_bit(path):
    torch = pytest.importorskip("torch")
    expected = dict(_torch_leaves(_torch_load(FIXTURES / path)))
    with wio.open(FIXTURES / path) as ckpt:
        assert sorted(ckpt) == sorted(expected)
        for name, ref in expected.items():
            view = ckpt[name]
            if isinstance(ref, np.ndarray):
                assert view.numpy().tobytes() == np.ascontiguousarray(ref).tobytes()
                continue
            if ref.dtype == torch.float4_e2m1fn_x2:
                assert view.raw().tobytes() == ref.view(torch.uint8).numpy().tobytes()
                continue
            ours = view.numpy()
            assert ours.shape == tuple(ref.shape)
            assert ours.tobytes() == _bytes_of(ref.detach()), name
            if view.info.strides is not None:
                assert tuple(s // ours.itemsize for s in view.info.strides) == ref.stride(), name


def test_plain_pickles_match_pickle_load():
    import pickle

    for protocol in (2, 4):
        path = PT / f"numpy_weights_p{protocol}.pkl"
        expected = pickle.loads(path.read_bytes())  # written by the fixture script: trusted
        with wio.open(path) as ckpt:
            assert list(ckpt) == list(expected)
            for name, arr in expected.items():
                assert ckpt[name].numpy().tobytes() == arr.tobytes() and ckpt[name].shape == arr.shape


def test_storage_sharing_matches_torch():
    torch = pytest.importorskip("torch")
    for name in VIEWS:
        ref = _torch_load(PT / name)
        with wio.open(PT / name) as ckpt:
            tensors = [n for n in ref if isinstance(ref[n], torch.Tensor)]
            for a in tensors:
                for b in tensors:
                    same = ref[a].untyped_storage().data_ptr() == ref[b].untyped_storage().data_ptr()
                    if not same:
                        assert not np.shares_memory(ckpt[a].numpy(), ckpt[b].numpy()), (a, b)


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_random_views_read_as_torch_reads_them(tmp_path_factory, data):
    torch = pytest.importorskip("torch")
    dtype = data.draw(st.sampled_from([torch.float32, torch.int64, torch.bfloat16, torch.float16, torch.bool,
                                       torch.uint8, torch.float64]))
    shape = data.draw(st.lists(st.integers(0, 5), min_size=0, max_size=4))
    base = torch.arange(int(np.prod(shape)) if shape else 1).reshape(shape).to(dtype)
    view = base
    for _ in range(data.draw(st.integers(0, 3))):
        if view.dim() == 0:
            break
        op = data.draw(st.sampled_from(["t", "slice", "narrow", "expand", "select"]))
        dim = data.draw(st.integers(0, view.dim() - 1))
        if op == "t" and view.dim() >= 2:
            view = view.transpose(dim, view.dim() - 1)
        elif op == "slice" and view.shape[dim] > 0:
            start, step = data.draw(st.integers(0, view.shape[dim] - 1)), data.draw(st.integers(1, 3))
            view = view.narrow(dim, start, view.shape[dim] - start)[(slice(None),) * dim + (slice(None, None, step),)]
        elif op == "narrow" and view.shape[dim] > 0:
            view = view.narrow(dim, data.draw(st.integers(0, view.shape[dim] - 1)), 1)
        elif op == "expand" and view.shape[dim] == 1:
            view = view.expand(*[3 if i == dim else -1 for i in range(view.dim())])
        elif op == "select" and view.shape[dim] > 0:
            view = view.select(dim, 0)
    legacy = data.draw(st.booleans())
    path = tmp_path_factory.mktemp("views") / "v.pt"
    torch.save({"base": base, "view": view}, path, _use_new_zipfile_serialization=not legacy)
    with wio.open(path) as ckpt:
        ours = ckpt["view"].numpy()
        assert ours.shape == tuple(view.shape)
        assert ours.tobytes() == _bytes_of(view)
        if view.numel():
            assert np.shares_memory(ours, ckpt["base"].numpy())


# ----------------------------------------------------------------------------- issue 13: files users have


def _torch_or_none():
    try:
        import torch
    except ImportError:
        return None
    return torch


def test_saves_without_crc32_read_as_torch_reads_them():
    # torch.serialization.set_crc32_options(False) writes 0 for every CRC; torch checks none on reading
    with zipfile.ZipFile(PT / "no_crc32.pt") as z:
        assert {info.CRC for info in z.infolist()} == {0}
    with wio.open(PT / "no_crc32.pt") as ckpt:
        np.testing.assert_array_equal(ckpt["w"].numpy(), np.arange(6, dtype=np.float32).reshape(2, 3) / 4)
        _check_manifest(ckpt, "pytorch/no_crc32.pt")
    assert wio.scan(PT / "no_crc32.pt").safe


def test_a_checkpoint_rezipped_with_deflate_reads_every_record(tmp_path):
    # the zeros record inflates to 4096 bytes, more than the whole 1.4 kB file
    with zipfile.ZipFile(PT / "deflated.pt") as z:
        assert {info.compress_type for info in z.infolist()} == {zipfile.ZIP_DEFLATED}
    assert (PT / "deflated.pt").stat().st_size < 4096
    with wio.open(PT / "deflated.pt") as ckpt:
        assert not ckpt["zeros"].numpy().any() and ckpt["zeros"].shape == (32, 32)
        _check_manifest(ckpt, "pytorch/deflated.pt")
    # as `zip -r` writes it: directory entries first (the first names the prefix), records deflated
    path = tmp_path / "zip_r.pt"
    with zipfile.ZipFile(PT / "deflated.pt") as src, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as dst:
        dst.writestr("archive/", b"")
        dst.writestr("archive/data/", b"")
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
    with wio.open(path) as ckpt:
        _check_manifest(ckpt, "pytorch/deflated.pt")


def test_sub_byte_quantized_tensors_are_listed_and_the_rest_reads():
    with wio.open(PT / "quint4x2.pt") as ckpt:
        listed = {n: (ckpt[n].shape, str(ckpt[n].info.dtype), ckpt[n].nbytes) for n in ckpt}
        # nbytes: torch's layout, each row rounded up to whole bytes (what the storage holds)
        assert listed == {"q4": ((2, 4), "uint8", 4), "q4_rows": ((2, 3), "uint8", 4), "q2": ((2, 4), "uint8", 2),
                          "dense": ((3,), "float32", 12)}
        np.testing.assert_array_equal(ckpt["dense"].numpy(), np.arange(3, dtype=np.float32) / 2)
        schemes = {"q4": "per_tensor_affine", "q4_rows": "per_channel_affine", "q2": "per_tensor_affine"}
        for name, scheme in schemes.items():
            with pytest.raises(UnsupportedDTypeError, match=rf"tensor '{name}': quantized tensor \(torch.{scheme}\); "
                                                            "weightio does not dequantize"):
                ckpt[name].numpy()
    torch = _torch_or_none()
    if torch is not None:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns that quantized tensors (and TypedStorage) are deprecated
            ref = torch.load(PT / "quint4x2.pt", weights_only=True)
        with wio.open(PT / "quint4x2.pt") as ckpt:
            for name, t in ref.items():
                assert ckpt[name].shape == tuple(t.shape)
                if t.is_quantized:
                    assert ckpt[name].nbytes == t.untyped_storage().nbytes()
            assert ckpt["dense"].numpy().tobytes() == ref["dense"].numpy().tobytes()


def test_strided_nested_tensors_list_their_components_as_unbind_gives_them():
    with wio.open(PT / "nested_tensor.pt") as ckpt:
        assert list(ckpt) == ["nt[0]", "nt[1]", "nt_t[0]", "nt_t[1]", "ids[0]", "ids[1]", "dense"]
        np.testing.assert_array_equal(ckpt["nt[1]"].numpy(), np.arange(12, dtype=np.float32).reshape(4, 3) + 100)
        np.testing.assert_array_equal(ckpt["nt_t[0]"].numpy(), np.arange(6, dtype=np.float32).reshape(2, 3).T)
        assert ckpt["nt_t[0]"].info.strides == (4, 12)
        assert np.shares_memory(ckpt["nt[0]"].numpy(), ckpt.readers[0].file.data)  # zero-copy views
        assert ckpt["ids[1]"].dtype == np.int64 and ckpt["ids[1]"].shape == (5,)
        _check_manifest(ckpt, "pytorch/nested_tensor.pt")


@pytest.mark.parametrize("name", ["empty_dtypes.pt", "empty_dtypes_legacy.pt"])
def test_an_empty_storage_under_three_dtypes_reads_as_torch_reads_it(name):
    with wio.open(PT / name) as ckpt:
        assert {n: (str(ckpt[n].dtype), ckpt[n].shape) for n in ckpt} == {
            "f32": ("float32", (0,)), "i32": ("int32", (0,)), "u8": ("uint8", (0,)), "other": ("int64", (0, 3))}
        _check_manifest(ckpt, f"pytorch/{name}")


PY2_METADATA = {"café": "naïve — résumé", "epoch": 7}  # torch.load(weights_only=True) of py2_legacy.pt


def test_python2_legacy_tensor_classes_and_strings_read_as_torch_reads_them():
    with wio.open(PT / "py2_legacy.pt") as ckpt:
        assert ckpt.readers[0].container == "legacy"
        assert ckpt.metadata == PY2_METADATA
        weights = np.arange(6, dtype=np.float32) / 4
        np.testing.assert_array_equal(ckpt["conv.weight"].numpy(), weights.reshape(2, 3))
        np.testing.assert_array_equal(ckpt["conv.weight_t"].numpy(), weights.reshape(2, 3).T)  # NEWOBJ, strided
        np.testing.assert_array_equal(ckpt["flat"].numpy(), weights)  # torch.Tensor + (storage,)
        np.testing.assert_array_equal(ckpt["steps"].numpy(), [1, 2, 3])  # (storage, offset, size)
        assert ckpt["unset"].shape == (0,) and ckpt["unset"].dtype == np.float64  # never given a state
        assert np.shares_memory(ckpt["conv.weight"].numpy(), ckpt["conv.weight_t"].numpy())
        _check_manifest(ckpt, "pytorch/py2_legacy.pt")
    torch = _torch_or_none()
    if torch is not None:
        ref = torch.load(PT / "py2_legacy.pt", weights_only=True)
        assert {k: v for k, v in ref.items() if not isinstance(v, torch.Tensor)} == PY2_METADATA
        assert ref["unset"].dtype == torch.float64 and ref["unset"].shape == (0,)


def test_python2_long_strings_and_bytes_that_are_not_utf8():
    long_text = "ü" * 200  # BINSTRING: torch's weights_only unpickler does not know it; pickle reads it as UTF-8
    with wio.open(PT / "py2_binstring.pt") as ckpt:
        assert ckpt.metadata == {"note": long_text}
        _check_manifest(ckpt, "pytorch/py2_binstring.pt")
    with wio.open(PT / "py2_not_utf8.pt") as ckpt:  # torch.load refuses it (UnicodeDecodeError); kept as bytes
        assert ckpt.metadata == {"note": repr(b"\xff\xfe latin-1 \xe9")}
        np.testing.assert_array_equal(ckpt["w"].numpy(), [0, 1])
    torch = _torch_or_none()
    if torch is not None:
        assert torch.load(PT / "py2_binstring.pt", weights_only=False)["note"] == long_text
        for weights_only in (True, False):
            with pytest.raises(Exception, match="can't decode byte 0xff in position 0"):
                torch.load(PT / "py2_not_utf8.pt", weights_only=weights_only)


def test_python2_numpy_pickles_keep_their_exact_bytes():
    import pickle

    path = PT / "py2_numpy.pkl"
    expected = pickle.loads(path.read_bytes(), encoding="latin1")  # written by the fixture script: trusted
    with wio.open(path) as ckpt:
        for name, arr in expected.items():
            assert ckpt[name].numpy().tobytes() == arr.tobytes()
        _check_manifest(ckpt, "pytorch/py2_numpy.pkl")


_SMALL = st.integers(0, 4)
_GEOMETRY = st.one_of(_SMALL, _SMALL, _SMALL, st.integers(-2, 6), st.integers(2**256 - 2, 2**256 + 1), st.booleans(),
                      st.sampled_from([1.0, 2.0]))


@settings(max_examples=2000, deadline=None)
@example(size=(2, 3), stride=(3, 1), offset=0)
@example(size=(2, 3), stride=(1, 2), offset=5)
@example(size=(4, 1), stride=(1, 7), offset=0)
@example(size=(0, 4), stride=(4, 1), offset=3)
@example(size=(3,), stride=(2,), offset=1)
@example(size=(True, 2), stride=(2, 1), offset=0)
@given(size=st.lists(_GEOMETRY, max_size=3).map(tuple), stride=st.lists(_GEOMETRY, max_size=3).map(tuple),
       offset=st.one_of(st.integers(-1, 9), st.just(2**256), st.just(1.0)))
def test_the_extent_of_a_vector_or_matrix_is_the_loop_s(size, stride, offset):
    from weightio.formats.pytorch import reader

    found = reader._extent(size, stride, offset)
    assert found == reader._extent_loop(size, stride, offset)
    assert [type(x) for x in found[1:]] == [type(x) for x in reader._extent_loop(size, stride, offset)[1:]]
