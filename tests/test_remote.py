"""Remote checkpoints read by byte range (weightio/_remote.py, weightio/remote.py) against real loopback
servers: the HTTP server (Range, ETag, If-Match), moto's S3 server through s3fs, the fake Hub.

Every test asserts the bytes and requests that moved, counted by the server, besides the values.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import save

import weightio as wio
from tests.remote_fixtures import traffic
from weightio import _failures, _remote
from weightio.errors import CorruptFileError, InputError, UsageError

BLOCK = _remote.BLOCK


def _tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "embed": rng.standard_normal((512, 256)).astype(np.float32),  # 512 KiB
        "w": rng.standard_normal((256, 1024)).astype(np.float16),  # 512 KiB, rows of 2 KiB
        "b": np.arange(7, dtype=np.int64),
    }


def _header_bytes(blob: bytes) -> int:
    return 8 + int.from_bytes(blob[:8], "little")


@pytest.fixture
def model(remote_files):
    tensors = _tensors()
    blob = save(tensors)
    url = remote_files.put("m/model.safetensors", blob)
    remote_files.reset()
    return url, tensors, blob


def test_open_fetches_only_the_header(remote_files, model):
    url, tensors, blob = model
    with wio.open(url) as ckpt:
        assert list(ckpt) == sorted(tensors) or list(ckpt) == list(tensors)
        assert {n: (ckpt[n].shape, ckpt[n].dtype) for n in ckpt} == {n: (a.shape, a.dtype) for n, a in tensors.items()}
        assert ckpt.path == url and ckpt.files == [url]
        requests, moved = remote_files.moved()
        assert traffic(ckpt) == (1, BLOCK)
    assert _header_bytes(blob) < BLOCK
    assert (requests, moved) == (1, BLOCK)  # one ranged GET: the first block, and the size (Content-Range)


def test_reading_a_tensor_fetches_exactly_its_bytes(remote_files, model):
    url, tensors, _ = model
    with wio.open(url) as ckpt:
        remote_files.reset()
        got = ckpt["embed"].numpy()
        assert np.array_equal(got, tensors["embed"]) and not got.flags.writeable
        assert remote_files.moved() == (1, tensors["embed"].nbytes)
        assert np.array_equal(ckpt["b"].numpy(), tensors["b"])  # in the first block: already cached


def test_a_fetched_tensor_is_the_reads_own_memory_for_torch(remote_files, model, monkeypatch):
    # each read fetches into memory of its own (read-only as every array handed out): its torch
    # tensor takes it without a copy, and a write to it reaches no later read; an array the caller
    # holds is copied for torch
    pytest.importorskip("torch")
    from weightio import devices

    from .memory import handovers_taken

    taken = handovers_taken(monkeypatch)
    url, tensors, _ = model
    with wio.open(url) as ckpt:
        tensor = ckpt["embed"].to("torch")
        assert taken == [tensor.data_ptr()]
        tensor.fill_(3.0)
        got = ckpt["embed"].numpy()
        devices.place(got, "torch").fill_(4.0)
        assert np.array_equal(got, tensors["embed"]) and not got.flags.writeable
        assert np.array_equal(ckpt["embed"].numpy(), tensors["embed"]) and len(taken) == 1


def test_a_slice_fetches_only_the_selected_bytes(remote_files, model):
    url, tensors, _ = model
    with wio.open(url) as ckpt:
        remote_files.reset()
        assert np.array_equal(ckpt["embed"][10:20], tensors["embed"][10:20])
        assert remote_files.moved() == (1, 10 * 256 * 4)
        remote_files.reset()
        # a row-parallel shard: rank 1 of 4 along dim 1: one run per row, 512 of 2048 bytes each
        shard = ckpt["w"][:, 256:512]
        assert np.array_equal(shard, tensors["w"][:, 256:512])
        assert remote_files.moved() == (256, 256 * 512)


def test_the_varbuilder_tensor_parallel_shard_is_fetched_alone(remote_files, model):
    url, tensors, _ = model
    vb = wio.VarBuilder.from_path(url)
    remote_files.reset()
    part = vb.get_sharded((512, 256), "embed", 0, 2, 4)
    assert np.array_equal(part, tensors["embed"][256:384])
    assert remote_files.moved()[1] == tensors["embed"].nbytes // 4


KEYS = [0, -1, 5, (3, 4), (slice(None), 3), (Ellipsis, 0), (None, 2), (slice(2, 9, 3),), (slice(None, None, -1),),
        (slice(100, 90),), (slice(-5, None), slice(7, 200, 11)), (1, Ellipsis, None), ()]


@pytest.mark.parametrize("key", KEYS, ids=repr)
def test_any_basic_index_matches_numpy(remote_files, model, key):
    url, tensors, _ = model
    with wio.open(url) as ckpt:
        for name in ("embed", "w"):
            expected = tensors[name][key]
            got = ckpt[name][key]
            assert got.shape == expected.shape and np.array_equal(got, expected)


def test_advanced_and_bad_indices_behave_as_numpy(remote_files, model):
    url, tensors, _ = model
    with wio.open(url) as ckpt:
        rows = np.array([3, 1, 400])
        assert np.array_equal(ckpt["embed"][rows], tensors["embed"][rows])
        assert np.array_equal(ckpt["b"][tensors["b"] > 3], tensors["b"][tensors["b"] > 3])
        for bad in [(512,), (0, 0, 0), (Ellipsis, Ellipsis)]:
            with pytest.raises(IndexError):
                tensors["embed"][bad]
            with pytest.raises(IndexError):
                ckpt["embed"][bad]


def test_a_folder_url_opens_like_a_model_directory(remote_files):
    tensors = _tensors()
    first, second = {"embed": tensors["embed"]}, {"w": tensors["w"], "b": tensors["b"]}
    index = {"metadata": {"total_size": 1}, "weight_map": {"embed": "model-00001-of-00002.safetensors",
                                                           "w": "model-00002-of-00002.safetensors",
                                                           "b": "model-00002-of-00002.safetensors"}}
    remote_files.put("sharded/model-00001-of-00002.safetensors", save(first))
    remote_files.put("sharded/model-00002-of-00002.safetensors", save(second))
    remote_files.put("sharded/model.safetensors.index.json", json.dumps(index).encode())
    remote_files.put("sharded/config.json", b"{}")
    for where in (remote_files.url("sharded/"), remote_files.url("sharded/model.safetensors.index.json")):
        with wio.open(where) as ckpt:
            assert sorted(ckpt) == ["b", "embed", "w"] and ckpt.metadata["total_size"] == 1
            assert np.array_equal(ckpt["w"][7], tensors["w"][7])
            assert [f.rsplit("/", 1)[1] for f in ckpt.files] == ["model-00001-of-00002.safetensors",
                                                                 "model-00002-of-00002.safetensors"]


def test_a_file_changed_on_the_server_is_refused(remote_files, model):
    url, tensors, blob = model
    with wio.open(url) as ckpt:
        changed = bytearray(blob)
        changed[-1] ^= 0xFF  # same size, new bytes: a new ETag
        remote_files.put("m/model.safetensors", bytes(changed))
        with pytest.raises(CorruptFileError, match="changed since it was opened") as e:
            ckpt["embed"].numpy()
    assert e.value.path == url


def test_a_server_ignoring_range_is_refused_not_downloaded(remote_files, model):
    url, tensors, blob = model
    remote_files.server.ignore_range = True
    assert len(blob) > BLOCK
    with pytest.raises(InputError, match="ignores Range requests") as e:
        wio.open(url)  # the first ranged GET answered 200 with the whole file: refused, its body unread
    assert e.value.path == url
    assert remote_files.server.count(contains="model.safetensors") == 1
    # a file smaller than the first block is whole in that answer: nothing more is asked
    small = {"w": np.arange(6, dtype=np.float32)}
    small_url = remote_files.put("m/small.safetensors", save(small))
    remote_files.reset()
    with wio.open(small_url) as ckpt:
        assert np.array_equal(ckpt["w"].numpy(), small["w"])
        assert traffic(ckpt) == (1, len(save(small)))


def test_missing_denied_and_failing_urls(remote_files, model, monkeypatch):
    url, *_ = model
    monkeypatch.setattr(_failures, "BACKOFF", 0.01)
    with pytest.raises(InputError, match=r"not found \(HTTP 404\)") as e:
        wio.open(remote_files.url("m/absent.safetensors"))
    assert isinstance(e.value, FileNotFoundError) and e.value.path == remote_files.url("m/absent.safetensors")
    remote_files.server.failures["model.safetensors"] = 500
    with pytest.raises(InputError) as e:
        wio.open(url)
    assert str(e.value) == f"{url}: the server answered HTTP 500: Internal Server Error"
    # retried, then given up (one ranged GET each time)
    assert remote_files.server.count(contains="model.safetensors") == _failures.RETRIES


def test_transient_failures_are_retried(remote_files, model, monkeypatch):
    url, tensors, _ = model
    monkeypatch.setattr(_failures, "BACKOFF", 0.01)
    with wio.open(url) as ckpt:
        remote_files.reset()
        remote_files.server.failures["model.safetensors"] = [503, 502]
        assert np.array_equal(ckpt["embed"].numpy(), tensors["embed"])
        assert [r.status for r in remote_files.server.requests] == [503, 502, 206]


def test_credentials_never_appear_in_messages(remote_files, model):
    url, *_ = model
    remote_files.server.auth = ("user", "right")
    wrong = url.replace("http://", "http://user:s3cret-word@")
    with pytest.raises(InputError, match=r"access denied \(HTTP 40[13]\)") as e:
        wio.open(wrong)
    assert "s3cret-word" not in str(e.value) and e.value.path == url
    signed = url + "?X-Amz-Signature=deadbeef&token=hf_abcdefghijkl"
    remote_files.server.auth = None
    with wio.open(signed) as ckpt:
        assert ckpt.path == url + "?…"
    with pytest.raises(CorruptFileError) as e:
        with wio.open(signed) as ckpt:
            ckpt.readers[0].file.read(0, 10**9, "a huge read")
    assert "deadbeef" not in str(e.value) and "hf_abc" not in str(e.value)


def test_offsets_past_the_remote_size_are_refused_before_fetching(remote_files):
    tensors = _tensors()
    blob = bytearray(save(tensors))
    header = blob[8:_header_bytes(blob)].decode()
    lying = header.replace(f'"data_offsets":[0,{tensors["b"].nbytes}]', f'"data_offsets":[0,{10**12}]', 1)
    assert lying != header
    remote_files.put("lying.safetensors", bytes(blob[:8]) + lying.encode() + bytes(blob[_header_bytes(blob):]))
    remote_files.reset()
    with pytest.raises(CorruptFileError):
        wio.open(remote_files.url("lying.safetensors"))
    assert remote_files.moved()[1] <= BLOCK


def test_usage_errors():
    with pytest.raises(UsageError, match="hf:// paths only"):
        wio.open("https://127.0.0.1:1/x.safetensors", download=True)
    with pytest.raises(UsageError, match="URLs only"):
        wio.open("model.safetensors", storage_options={"key": "x"})
    with pytest.raises(UsageError):
        wio.open("nosuchscheme://bucket/x.safetensors")


def test_closed_checkpoints_refuse_reads(remote_files, model):
    url, *_ = model
    ckpt = wio.open(url)
    view = ckpt["embed"]
    ckpt.close()
    with pytest.raises(wio.WeightioError, match="closed"):
        view.numpy()


# ----------------------------------------------------------------------------- S3


def test_s3_urls_read_by_range(s3_server):
    tensors = _tensors()
    blob = save(tensors)
    url = s3_server.put("models", "tiny/model.safetensors", blob)
    s3_server.reset()
    with wio.open(url, storage_options=s3_server.storage_options) as ckpt:
        assert sorted(ckpt) == sorted(tensors)
        opened = s3_server.sent()
        assert np.array_equal(ckpt["w"][:, 0:256], tensors["w"][:, 0:256])
        assert s3_server.sent() - opened == 256 * 512
    assert opened <= BLOCK
    with wio.open("s3://models/tiny/") as ckpt:  # the AWS chain from the environment; a prefix as a folder
        assert np.array_equal(ckpt["embed"].numpy(), tensors["embed"])
    with pytest.raises(InputError, match="not found") as e:
        wio.open("s3://models/tiny/absent.safetensors")
    assert e.value.path == "s3://models/tiny/absent.safetensors"


def test_s3_object_replaced_while_open_is_refused(s3_server):
    tensors = _tensors()
    blob = save(tensors)
    url = s3_server.put("models", "model.safetensors", blob)
    with wio.open(url) as ckpt:
        s3_server.put("models", "model.safetensors", blob[:-1] + b"\x00")
        with pytest.raises(CorruptFileError, match="changed since it was opened"):
            ckpt["embed"].numpy()


def test_answers_that_arrive_in_pieces_are_read_whole(s3_server, remote_files, model):
    """A body that comes in pieces (a loaded machine, a slow link: aiobotocore's and aiohttp's reads
    answer what has arrived) is still read whole: the S3 probe, and a wave of ranges, ask nothing
    again (a partial first read had sent the S3 probe back to a HEAD and a second GET)."""
    tensors = _tensors()
    blob = save(tensors)
    url = s3_server.put("models", "trickled/model.safetensors", blob)
    s3_server.reset()
    s3_server.trickle = 0.002
    with wio.open(url, storage_options=s3_server.storage_options) as ckpt:
        s3_server.idle()
        assert [(r.method, r.range) for r in s3_server.requests] == [("GET", "bytes=0-65535")]
        assert ckpt["embed"].numpy().tobytes() == tensors["embed"].tobytes()
    url, tensors, _ = model
    remote_files.server.trickle = 0.002
    remote_files.reset()
    with wio.open(url) as ckpt:
        assert traffic(ckpt)[0] == 1
        assert all(ckpt[n].numpy().tobytes() == tensors[n].tobytes() for n in tensors)


def test_s3_object_is_found_by_its_first_get_and_a_prefix_as_a_folder(s3_server):
    """An S3 object's first ranged GET brings its size and ETag (no HEAD); a prefix named without
    its slash answers that GET no object, and is then found as a folder."""
    tensors = _tensors()
    blob = save(tensors)
    url = s3_server.put("models", "plain/model.safetensors", blob)
    s3_server.reset()
    with wio.open(url, storage_options=s3_server.storage_options) as ckpt:
        s3_server.idle()
        assert [(r.method, r.range) for r in s3_server.requests] == [("GET", "bytes=0-65535")]
        assert np.array_equal(ckpt["embed"].numpy(), tensors["embed"])
    with wio.open("s3://models/plain", storage_options=s3_server.storage_options) as ckpt:
        assert sorted(ckpt) == sorted(tensors)
