"""GGUF and legacy ggml files read by URL (issue 14): opening fetches the headers only, in few round
trips; every tensor, dtype and metadata value equals the local open's; tensors fetch their own bytes;
hostile remote files are refused as locally, before anything past the file is asked for."""

from __future__ import annotations

import random
import struct

import numpy as np
import pytest

import weightio as wio
from tests.hostile import STRING, gguf, ginfo, gkv, gstr
from tests.remote_fixtures import traffic
from weightio.errors import CorruptFileError, WeightioError
from weightio.formats.gguf_arrays import GGUFArray
from weightio.formats.gguf_fields import GGUFValueType
from weightio.remote import first_reads

from .conftest import FIXTURES

SLACK = 64 << 10  # the target: a header costs at most its bytes and one 64 KiB block more
GGUF_FILES = ["gguf/all_types.gguf", "gguf/big_endian.gguf", "gguf/metadata.gguf", "gguf/quantized.gguf",
              "gguf/v1.gguf", "gguf/v2.gguf"]
GGML_FILES = ["ggml/ggjt_v1.bin", "ggml/ggjt_v2.bin", "ggml/ggjt_v3.bin", "ggml/ggmf.bin", "ggml/ggml.bin",
              "ggml/llama-f16.bin", "ggml/llama-f32.bin", "ggml/llama-q8_0.bin", "ggml/whisper.bin",
              "ggml/whisper_qnt0.bin", "ggml/whisper_qnt1.bin", "whisper/tiny-f16.bin", "whisper/tiny-q4_0.bin",
              "whisper/tiny-q8_0.bin"]


def header_length(reader) -> int:
    """Bytes of a file that are not tensor data: GGUF's data-section offset; for ggml (headers
    interleaved with data), everything before the first tensor's data and between tensors."""
    if reader.format == "gguf":
        return reader.data_offset
    infos = sorted(reader.tensors.values(), key=lambda info: info.offset)
    return infos[0].offset + sum(b.offset - (a.offset + a.nbytes) for a, b in zip(infos, infos[1:], strict=False))


def plain(value):
    return value.tolist() if isinstance(value, GGUFArray) else value


def assert_same_header(remote, local) -> None:
    assert list(remote) == list(local)
    for name in local:
        r, loc = remote[name], local[name]
        assert (r.shape, r.dtype, r.ggml_type, r.nbytes) == (loc.shape, loc.dtype, loc.ggml_type, loc.nbytes), name
    assert remote.metadata.keys() == local.metadata.keys()
    for key, value in local.metadata.items():
        assert plain(remote.metadata[key]) == plain(value), key


def read_or_error(view, key=None):
    try:
        return view.numpy() if key is None else view[key]
    except WeightioError as e:
        return type(e), e.message


def assert_same(a, b, name) -> None:
    if isinstance(a, tuple):
        assert a == b, name
    else:
        np.testing.assert_array_equal(a, b, err_msg=name)
        assert a.dtype == b.dtype, name


@pytest.mark.parametrize("name", GGUF_FILES + GGML_FILES)
def test_fixture_opens_remotely_fetching_its_headers_only(remote_files, name):
    raw = (FIXTURES / name).read_bytes()
    url = remote_files.put(name, raw)
    with wio.open(FIXTURES / name) as local, wio.open(url) as remote:
        requests, fetched = traffic(remote)
        header = header_length(local.readers[0])
        guess = min(len(raw), first_reads(name)[1])  # a .bin's last bytes, asked with its first in case it is a zip
        assert fetched <= min(len(raw), header + SLACK) + guess
        if name.endswith(".gguf"):
            assert requests <= 4
        assert_same_header(remote, local)
        for tensor in local:
            assert_same(read_or_error(remote[tensor]), read_or_error(local[tensor]), tensor)
            if local[tensor].shape and local[tensor].shape[0] > 1:
                assert_same(read_or_error(remote[tensor], slice(1, None)),
                            read_or_error(local[tensor], slice(1, None)), tensor)


@pytest.mark.parametrize("name", ["whisper/tiny-f16.bin", "whisper/tiny-q4_0.bin", "ggml/llama-f32.bin"])
def test_ggml_tensor_headers_come_without_tensor_data(remote_files, name):
    """Files larger than one block: their tensor headers are fetched alone, and a tensor read then
    moves its own bytes (and at most one block more)."""
    raw = (FIXTURES / name).read_bytes()
    assert len(raw) > SLACK + 4096
    with wio.open(FIXTURES / name) as local, wio.open(remote_files.put(name, raw)) as remote:
        _, fetched = traffic(remote)
        guess = first_reads(name)[1]  # a .bin's last bytes, asked with its first in case it is torch's zip
        assert fetched <= header_length(local.readers[0]) + SLACK + guess
        assert fetched < len(raw) - 4096  # most tensor data was not fetched
        biggest = max(local, key=lambda t: local[t].nbytes)
        before = traffic(remote)[1]
        assert_same(remote[biggest].numpy(), local[biggest].numpy(), biggest)
        assert traffic(remote)[1] - before <= local[biggest].nbytes + SLACK


@pytest.mark.parametrize("part", [1, 2, 3])
def test_any_part_of_a_remote_split_set_opens_the_whole_model(remote_files, part):
    folder = FIXTURES / "gguf" / "split"
    urls = {p.name: remote_files.put(f"split/{p.name}", p.read_bytes()) for p in sorted(folder.iterdir())}
    first = f"model-0000{part}-of-00003.gguf"
    with wio.open(folder / first) as local, wio.open(urls[first]) as remote:
        assert [r.path for r in remote.readers][0] == urls[first]
        assert sorted(r.path for r in remote.readers) == sorted(urls.values())
        assert_same_header(remote, local)
        for tensor in local:
            assert_same(remote[tensor].numpy(), local[tensor].numpy(), tensor)


# ----------------------------------------------------------------------------- a large vocabulary


def _vocabulary_file(path, kind: str, n_vocab: int = 50_000, n_tensors: int = 300) -> None:
    """A GGUF laid out as llama.cpp's converters write them: tokenizer model, tokens whose lengths
    grow with their rank (as BPE merges do), then scores and types (SentencePiece, ``llama``) or
    types and merges (BPE, ``gpt2``), a chat template, and small tensors."""
    gguf_py = pytest.importorskip("gguf")
    rng = random.Random(14)

    def token(rank: int) -> str:
        length = 1 + min(15, int(rng.expovariate(1 / (2 + 6 * rank / n_vocab))))
        return "".join(rng.choice("abcdefghijklmnopqrstuvwxyzĠ") for _ in range(length))

    writer = gguf_py.GGUFWriter(str(path), "llama")
    writer.add_block_count(n_tensors // 9)
    writer.add_tokenizer_model("llama" if kind == "spm" else "gpt2")
    writer.add_token_list([token(rank) for rank in range(n_vocab)])
    if kind == "spm":
        writer.add_token_scores([-float(rank) for rank in range(n_vocab)])
    writer.add_token_types([1] * n_vocab)
    if kind == "bpe":
        writer.add_token_merges([f"{token(rank)} {token(rank)}" for rank in range(n_vocab)])
    writer.add_chat_template("{% for m in messages %}{{ m.content }}{% endfor %}" * 20)
    for k in range(n_tensors):
        writer.add_tensor(f"blk.{k // 9}.ffn_{('gate', 'up', 'down')[k % 3]}_{k % 9}.weight",
                          np.full((4, 32), k, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("kind", ["spm", "bpe"])
def test_a_large_vocabulary_arrives_in_four_round_trips(remote_files, tmp_path, kind):
    path = tmp_path / f"{kind}.gguf"
    _vocabulary_file(path, kind)
    with wio.open(path) as local, wio.open(remote_files.put(path.name, path.read_bytes())) as remote:
        requests, fetched = traffic(remote)
        header = local.readers[0].data_offset
        assert header > 16 * SLACK  # the vocabulary is far more than the first block
        assert requests <= 4
        assert header <= fetched <= header + SLACK
        assert_same_header(remote, local)  # the arrays, decoded now from what open fetched
        assert traffic(remote) == (requests, fetched)
        tensor = "blk.3.ffn_down_5.weight"
        assert_same(remote[tensor].numpy(), local[tensor].numpy(), tensor)
        assert traffic(remote)[1] - fetched <= remote[tensor].nbytes + SLACK


def test_a_lazy_array_fetches_its_bytes_when_read(remote_files):
    """A metadata array whose bytes open did not fetch (here: one laid over the tensor data, past
    the header) fetches them when read, and only them."""
    values = np.arange(200_000, dtype="<f4")
    raw = gguf(infos=[ginfo("w", (len(values),))], data=values.tobytes())
    with wio.open(remote_files.put("lazy.gguf", raw)) as remote:
        reader = remote.readers[0]
        _, before = traffic(remote)
        array = GGUFArray.numbers(GGUFValueType.FLOAT32, reader.file, len(values), np.dtype("<f4"), reader.data_offset)
        assert traffic(remote)[1] == before  # located, not fetched
        np.testing.assert_array_equal(array.numpy(), values)
        assert before + len(raw) - SLACK <= traffic(remote)[1] <= before + values.nbytes + SLACK  # all but block 0


# ----------------------------------------------------------------------------- hostile remote files


@pytest.fixture
def open_both(tmp_path, remote_files, monkeypatch):
    """``open_both(name, raw)``: the errors opening `raw` from disk and by URL raise, the URL, and
    the ranges the URL's reader asked the server for (``(offset, length)``, from the server's log)."""

    def run(name: str, raw: bytes):
        (tmp_path / name).write_bytes(raw)
        with pytest.raises(WeightioError) as local:
            wio.open(tmp_path / name)
        url = remote_files.put(name, raw)
        remote_files.reset()
        with pytest.raises(WeightioError) as remote:
            wio.open(url)
        remote_files.server.idle()
        asked = []
        for request in remote_files.server.requests:
            assert request.range is not None and request.range.startswith("bytes="), request  # ranges only
            first, _, last = request.range[len("bytes="):].partition("-")
            asked.append((int(first), min(int(last) + 1, len(raw)) - int(first)))
        return local.value, remote.value, url, asked

    return run


def test_an_array_count_past_the_file_is_refused_before_any_fetch(open_both):
    tensor_data = np.zeros(64 << 10, np.float32).tobytes()  # 256 KiB of data after the header
    raw = gguf([gkv("tokenizer.ggml.tokens", 9, struct.pack("<IQ", STRING, 10**12))],
               [ginfo("w", (len(tensor_data) // 4,))], tensor_data)
    local, remote, url, asked = open_both("count.gguf", raw)
    assert type(remote) is type(local) is CorruptFileError
    assert remote.message == local.message and "1000000000000 strings" in remote.message
    assert remote.path == url
    assert asked == [(0, 64 << 10)]  # the first block; nothing asked for past it


def test_a_string_past_the_file_mid_vocabulary_is_refused_without_fetching_it(open_both):
    tokens = [gstr(f"token{k}") for k in range(20_000)]  # ~280 KB: past the first block
    tokens[15_000] = struct.pack("<Q", 1 << 40) + b"x"  # a length that points far past the file
    raw = gguf([gkv("tokenizer.ggml.tokens", 9, struct.pack("<IQ", STRING, len(tokens)) + b"".join(tokens))])
    local, remote, url, asked = open_both("long.gguf", raw)
    assert type(remote) is type(local) is CorruptFileError
    assert remote.message == local.message and "runs past the end of the file" in remote.message
    assert all(offset + length <= len(raw) for offset, length in asked)
    assert sum(length for _, length in asked) <= len(raw)


def test_a_truncated_remote_vocabulary_is_refused_as_locally(tmp_path, open_both):
    path = tmp_path / "spm.gguf"
    _vocabulary_file(path, "spm", n_vocab=20_000, n_tensors=10)
    raw = path.read_bytes()[:200_000]  # cut inside the token list
    local, remote, _, asked = open_both("cut.gguf", raw)
    assert type(remote) is type(local) is CorruptFileError
    assert remote.message == local.message
    assert sum(length for _, length in asked) <= len(raw)


def test_a_header_past_the_limit_is_refused_as_locally(tmp_path, open_both):
    path = tmp_path / "spm.gguf"
    _vocabulary_file(path, "spm", n_vocab=20_000, n_tensors=10)
    raw = path.read_bytes()
    with wio.limits.using(header_bytes=100_000):
        local, remote, _, asked = open_both("limited.gguf", raw)
    assert type(remote) is type(local)
    assert remote.message == local.message and "header_bytes" in remote.message
    assert max(offset + length for offset, length in asked) <= 100_000 + SLACK
