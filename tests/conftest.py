"""Shared test helpers: fixture paths, the manifest written by the fixture script, file builders."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import numpy as np
import pytest

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def manifest() -> dict[str, dict]:
    with open(FIXTURES / "manifest.json") as f:
        return json.load(f)


def digest(arr: np.ndarray) -> str:
    """SHA-256 of an array's C-ordered little-endian bytes (what fixtures/manifest.json records)."""
    arr = arr.copy(order="C")
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return hashlib.sha256(arr.reshape(-1).view(np.uint8).tobytes()).hexdigest()


def safetensors_bytes(header: dict | bytes | str, data: bytes = b"", *, length: int | None = None) -> bytes:
    """A safetensors file: u64 header length, header (JSON-encoded unless bytes/str), data."""
    if isinstance(header, dict):
        header = json.dumps(header)
    if isinstance(header, str):
        header = header.encode()
    n = len(header) if length is None else length
    return struct.pack("<Q", n) + header + data


@pytest.fixture
def write(tmp_path):
    """write(name, bytes) -> path of a new file in the test's temporary directory."""

    def _write(name: str, content: bytes) -> Path:
        path = tmp_path / name
        path.write_bytes(content)
        return path

    return _write

from tests.remote_fixtures import remote_files  # noqa: E402,F401 - a fixture for the remote tests
