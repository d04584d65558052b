"""hf:// checkpoints read by range from the fake Hub (tests/hubserver.py): headers only at open, a file
already in the Hub cache mapped from there, tokens never shown, a Hub ignoring Range refused."""

from __future__ import annotations

import numpy as np
import pytest
from safetensors.numpy import save

import weightio as wio
from tests.hubserver import Repo
from tests.remote_fixtures import traffic
from weightio import _remote
from weightio.errors import InputError

COMMIT = "a" * 40
BLOCK = _remote.BLOCK


def _tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {"a": rng.standard_normal((256, 512)).astype(np.float32), "b": np.arange(5, dtype=np.int32)}


def _repo(blob: bytes, token: str | None = None) -> Repo:
    return Repo({COMMIT: {"model.safetensors": blob, "config.json": b'{"model_type": "bert"}'}}, {"main": COMMIT},
                token)


def test_hf_open_reads_the_header_by_range_and_caches_nothing(serve_hub, tmp_path):
    tensors = _tensors()
    blob = save(tensors)
    hub = serve_hub({("model", "org/model"): _repo(blob)})
    with wio.open("hf://org/model") as ckpt:
        assert ckpt.files == ["hf://org/model/model.safetensors"]
        assert sorted(ckpt) == ["a", "b"]
        assert traffic(ckpt) == (1, BLOCK)
        opened = hub.sent(contains="/cdn/")
        assert np.array_equal(ckpt["a"][3:5], tensors["a"][3:5])
        assert hub.sent(contains="/cdn/") - opened == 2 * 512 * 4
    assert opened == BLOCK  # one block of a 512 KiB file: the header and nothing else
    snapshot = tmp_path / "hf-cache" / "models--org--model" / "snapshots"
    assert not snapshot.exists() or not any(p.is_file() for p in snapshot.rglob("*"))


def test_a_file_in_the_hub_cache_is_mapped_not_fetched(serve_hub):
    tensors = _tensors()
    hub = serve_hub({("model", "org/model"): _repo(save(tensors))})
    with wio.open("hf://org/model", download=True) as ckpt:  # into the cache, with config.json
        assert not ckpt.files[0].startswith("hf://")
    hub.reset()
    with wio.open("hf://org/model") as ckpt:
        assert not ckpt.files[0].startswith("hf://") and ckpt.files[0].endswith("model.safetensors")
        assert np.array_equal(ckpt["a"].numpy(), tensors["a"])
    assert hub.count(contains="model.safetensors") == 0


def test_private_repo_token_never_shown(serve_hub, monkeypatch):
    hub = serve_hub({("model", "org/private"): _repo(save(_tensors()), token="hf_secretsecretsecret")})
    monkeypatch.setenv("HF_TOKEN", "hf_wrongwrongwrongwrong")
    with pytest.raises(InputError) as e:
        wio.open("hf://org/private")
    assert "wrongwrong" not in str(e.value) and "secretsecret" not in str(e.value)
    monkeypatch.setenv("HF_TOKEN", "hf_secretsecretsecret")
    with wio.open("hf://org/private") as ckpt:
        assert sorted(ckpt) == ["a", "b"]
        ckpt["a"].numpy()
    cdn = [r for r in hub.requests if r.path.startswith("/cdn/")]
    assert cdn and all("authorization" not in r.headers for r in cdn)  # the token goes to the Hub only


def test_a_hub_ignoring_range_is_refused_without_downloading(serve_hub):
    blob = save({"big": np.zeros(8 << 20, np.float32)})  # 32 MiB: more than the sockets' buffers hold
    hub = serve_hub({("model", "org/model"): _repo(blob)})
    hub.ignore_range = True
    with pytest.raises(InputError, match="ignores Range requests") as e:
        wio.open("hf://org/model")
    assert e.value.path == "hf://org/model/model.safetensors"
    hub.idle()
    assert hub.sent(contains="/cdn/") < len(blob) // 2  # the body was not read: the connection was dropped


def test_offline_without_the_file_cached_says_so(serve_hub, monkeypatch):
    serve_hub({("model", "org/model"): _repo(save(_tensors()))})
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(InputError, match="HF_HUB_OFFLINE"):
        wio.open("hf://org/model")


def test_storage_options_do_not_apply_to_the_hub():
    with pytest.raises(wio.UsageError, match="do not apply to hf://"):
        wio.open("hf://org/model", storage_options={"token": "x"})


def test_hub_npz_headers_go_to_the_cdn_in_one_wave(serve_hub, tmp_path):
    """An .npz on the Hub: its first 4 KiB and last 16 KiB follow the Hub's redirect together; its
    members' local headers then go straight to the CDN, in one wave (no second redirect)."""
    arrays = {f"a{k}": np.arange(k, k + 20000, dtype=np.float32) for k in range(5)}
    path = tmp_path / "five.npz"
    np.savez(path, **arrays)
    hub = serve_hub({("model", "org/npz"): Repo({"c" * 40: {"five.npz": path.read_bytes()}}, {"main": "c" * 40})})
    hub.delay = 0.25  # (long enough for the wave's four requests to overlap on a loaded 2-CPU machine: 0.05 s was not)
    with wio.open("hf://org/npz/five.npz") as ckpt:
        hub.idle()
        assert sorted(ckpt) == sorted(arrays)
        assert hub.count(contains="/resolve/") == 2  # the first and last bytes, redirected together
        cdn = hub.matching(contains="/cdn/")
        assert len(cdn) == 2 + 4 and hub.peak_in_flight >= 4  # four local headers past the first 4 KiB, at once
        assert np.array_equal(ckpt["a3"].numpy(), arrays["a3"])


def test_a_named_file_is_asked_for_while_the_repo_is_listed(serve_hub):
    """hf://org/repo/file: its first bytes (and an archive's last) go out at the revision together
    with the listing, and are used once the listing says they came from its commit and size: one
    round trip less than listing first."""
    arrays = {"w": np.arange(30000, dtype=np.float32), "b": np.ones(7, np.int64)}
    import io

    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    blob = buffer.getvalue()
    hub = serve_hub({("model", "org/model"): Repo({COMMIT: {"w.npz": blob}}, {"main": COMMIT})})
    hub.delay = 0.1
    with wio.open("hf://org/model/w.npz") as ckpt:
        hub.idle()
        log = sorted(hub.requests, key=lambda r: r.started)
        listing = next(r for r in log if r.path.startswith("/api/"))
        firsts = [r for r in log if r.range in ("bytes=0-4095", "bytes=-16384") and "/resolve/main/" in r.path]
        assert len(firsts) == 2 and all(r.started < listing.finished for r in firsts)  # in flight with the listing
        assert not [r for r in log if f"/resolve/{COMMIT}/" in r.path]  # never asked again at the commit
        assert {n: ckpt[n].numpy().tobytes() for n in ckpt} == {n: a.tobytes() for n, a in arrays.items()}


def test_first_bytes_from_another_commit_are_not_used():
    from weightio import remote
    from weightio.hub import HubFile

    listed = HubFile("org/model", "model", COMMIT, "model.safetensors", "http://hub", 100_000, "hf://org/model")
    early = (b"x" * BLOCK, "http://cdn/1", None, COMMIT, 100_000)
    assert remote._taken(early, listed) == {"model.safetensors": (b"x" * BLOCK, "http://cdn/1", None)}
    assert remote._taken((*early[:3], "b" * 40, 100_000), listed) == {}  # the revision moved meanwhile
    assert remote._taken((*early[:4], 99_999), listed) == {}  # another size
    assert remote._taken((b"x" * 10, *early[1:]), listed) == {}  # a short first answer
    assert remote._taken(None, listed) == {}


def test_a_folder_or_a_cached_file_is_not_asked_for_before_the_listing(serve_hub):
    from weightio import hub as hubs

    tensors = _tensors()
    serve_hub({("model", "org/model"): _repo(save(tensors))})
    assert hubs.named_file("hf://org/model") is None
    assert hubs.named_file("hf://org/model/sub") is None
    assert hubs.named_file("hf://org/model/model.safetensors.index.json") is None
    assert hubs.named_file("hf://org/model/m-00001-of-00002.gguf") is None
    assert hubs.named_file("hf://org/model@v1/model.safetensors").commit == "v1"
    wio.open("hf://org/model", download=True).close()
    assert hubs.named_file("hf://org/model/model.safetensors") is None  # in the cache: mapped, not fetched
