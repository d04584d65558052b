"""S3 by ranges on s3fs's event loop: objects found by their first ranged GET, and waves of ranges.

* `probe`, `probe_all`: find S3 objects by a ranged GET of their first bytes (and their last, for
  a name a zip archive has: see `weightio.remote_http.first_reads`), all in one wave: the answer's
  ``ContentRange`` gives the size and its ``ETag`` the tag that guards later reads, so no ``HEAD``
  and no listing is needed;
* `wave`: many ranges of one object in flight at once (an archive's local headers), each answer
  checked (the exact length) and None where it is not what was asked (the caller asks that one
  again alone, with its retries and error reporting: see `weightio._remote`).

Requests go through s3fs's own request method (its credentials, client and retries). Where s3fs
is not as known (another version's internals), every function answers None and the caller finds
the objects one by one through fsspec's public methods.
"""

from __future__ import annotations

from typing import Any

from .remote_http import Found, first_reads, gather, read_up_to, total_size

__all__ = ["probe", "probe_all", "wave"]


def probe(fs: Any, path: str) -> Found | None:
    """An S3 object found by ranged GETs of its first bytes (and its last, as `first_reads` says),
    in flight together on s3fs's event loop: its ``ContentRange`` gives the size, the answer its
    ETag. None where the first GET did not answer a range of an object (no such key, a prefix,
    access denied, an empty object)."""
    return probe_all(fs, [path])[0]


def probe_all(fs: Any, paths: list[str]) -> list[Found | None]:
    """`probe` of every path at once, in one wave on s3fs's event loop (None for all where
    s3fs is not as known: each is then found by ``info``)."""
    from fsspec.asyn import sync

    try:
        call = fs._call_s3  # s3fs's request method (credentials, retries, its client)
        keys = [fs.split_path(path) for path in paths]
    except Exception:  # noqa: BLE001 - not s3fs as known: found by info
        return [None] * len(paths)

    async def every() -> list[Any]:
        return await gather(*(_probe_async(call, path, *key) for path, key in zip(paths, keys, strict=True)))

    try:
        got = sync(fs.loop, every)
    except Exception:  # noqa: BLE001 - found by info, which reports what is wrong
        return [None] * len(paths)
    return [r if isinstance(r, Found) else None for r in got]


async def _probe_async(call: Any, path: str, bucket: str, key: str, version: str | None) -> Found | None:
    head, tail = first_reads(path)
    if not key:
        return None

    async def get(asked: str, most: int) -> tuple[dict, bytes]:
        answer = await call("get_object", Bucket=bucket, Key=key, Range=asked, **({"VersionId": version} if version
                                                                                 else {}))
        try:
            return answer, await read_up_to(answer["Body"].read, most + 1)  # more than asked is caught below
        finally:
            answer["Body"].close()

    asked = [get(f"bytes=0-{head - 1}", head)] + ([get(f"bytes=-{tail}", tail)] if tail else [])
    got = await gather(*asked)
    if isinstance(got[0], BaseException):
        return None
    answer, first = got[0]
    size, etag = total_size(answer.get("ContentRange") or ""), answer.get("ETag")
    if size is None or len(first) != min(head, size):
        return None
    last = None
    if tail and not isinstance(got[1], BaseException):
        end, raw = got[1]
        same = total_size(end.get("ContentRange") or "") == size and end.get("ETag") == etag
        last = raw if same and len(raw) == min(tail, size) else None
    info = {"name": path, "size": size, "type": "file", "ETag": etag, "VersionId": answer.get("VersionId"),
            "LastModified": answer.get("LastModified"), "ContentType": answer.get("ContentType")}
    return Found(info, first, head, last)


def wave(fs: Any, path: str, etag: str | None, ranges: list[tuple[int, int]]) -> list[bytes | None]:
    """Each ``(offset, length)`` of the object at `path`, asked at once on s3fs's event loop
    (``If-Match`` `etag`); None for a range not answered exactly (and for all where s3fs is not as
    known)."""
    from fsspec.asyn import sync

    try:
        call = fs._call_s3
        bucket, key, version = fs.split_path(path)
    except Exception:  # noqa: BLE001 - not s3fs as known: each range asked alone
        return [None] * len(ranges)
    extra = ({"VersionId": version} if version else {}) | ({"IfMatch": etag} if etag else {})

    async def get(start: int, length: int) -> bytes | None:
        answer = await call("get_object", Bucket=bucket, Key=key, Range=f"bytes={start}-{start + length - 1}",
                            **extra)
        try:
            got = await read_up_to(answer["Body"].read, length + 1)
        finally:
            answer["Body"].close()
        return got if len(got) == length else None

    async def every() -> list[Any]:
        return await gather(*(get(a, n) for a, n in ranges))

    try:
        got = sync(fs.loop, every)
    except Exception:  # noqa: BLE001 - each range asked alone, its error reported there
        return [None] * len(ranges)
    return [r if isinstance(r, bytes) else None for r in got]
