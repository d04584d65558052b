"""Every committed fixture reads back exactly as the library that wrote it recorded it.

fixtures/manifest.json holds the SHA-256 of each tensor's bytes computed by torch / numpy at
generation time, so this checks weightio against an independent reference without torch.
"""

from __future__ import annotations

import pytest

import weightio as wio

from .conftest import FIXTURES, digest, manifest

CASES = [(path, name, spec) for path, tensors in manifest().items() for name, spec in tensors.items()]


@pytest.mark.parametrize("path", sorted(manifest()))
def test_fixture_lists_exactly_the_recorded_tensors(path):
    with wio.open(FIXTURES / path) as ckpt:
        assert sorted(ckpt) == sorted(manifest()[path])


@pytest.mark.parametrize("path,name,spec", CASES, ids=[f"{p}:{n}" for p, n, _ in CASES])
def test_fixture_tensor_bytes_match_the_writer(path, name, spec):
    with wio.open(FIXTURES / path) as ckpt:
        view = ckpt[name]
        assert list(view.shape) == spec["shape"]
        if spec["dtype"] == "F4":  # packed: compare the stored bytes
            import hashlib

            assert hashlib.sha256(view.raw().tobytes()).hexdigest() == spec["sha256"]
        else:
            assert digest(view.numpy()) == spec["sha256"]
