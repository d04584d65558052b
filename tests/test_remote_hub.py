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
    hub.delay = 0.05
    with wio.open("hf://org/npz/five.npz") as ckpt:
        hub.idle()
        assert sorted(ckpt) == sorted(arrays)
        assert hub.count(contains="/resolve/") == 2  # the first and last bytes, redirected together
        cdn = hub.matching(contains="/cdn/")
        assert len(cdn) == 2 + 4 and hub.peak_in_flight >= 4  # four local headers past the first 4 KiB, at once
        assert np.array_equal(ckpt["a3"].numpy(), arrays["a3"])
