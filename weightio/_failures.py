"""Remote failures sorted into weightio's errors, and what a message may show of a URL.

* `is_url`, `redact`, `scrub`: which paths are URLs; a URL as shown (no ``user:password@``, no
  query string: presigned URLs carry keys there); tokens and signatures removed from a message;
* `retrying`: one call of a transport, retried with exponential backoff on transient failures
  (5xx, 429, connection errors, timeouts; `RETRIES` tries), any other failure sorted by
  `describe_failure` into a `Failure` and raised as the `WeightioError` it becomes (404 and
  403 as `InputError` with the status, a failed ``If-Match`` as `CorruptFileError`, a server
  that ignores ``Range`` as `InputError`).

Every transport (aiohttp, httpx, botocore, fsspec, OSError) reaches the user through here.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

from .errors import CorruptFileError, InputError, WeightioError

__all__ = ["BACKOFF", "RETRIES", "Failure", "describe_failure", "is_url", "redact", "retrying", "scrub"]

RETRIES = 4  # tries of one range before its error is raised
BACKOFF = 0.25  # seconds before the first retry; doubles each time

_URL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
_USERINFO = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*://)[^/@?#]*@")


def is_url(path: object) -> bool:
    """Whether `path` is a URL weightio reads remotely (``hf://``, ``https://``, ``s3://`` …; not ``file://``)."""
    if not isinstance(path, str):
        return False
    match = _URL.match(path)
    return match is not None and match.group(1).lower() != "file"


def redact(url: str) -> str:
    """`url` as shown in messages: no ``user:password@``, no query string (presigned URLs carry keys there)."""
    url = _USERINFO.sub(r"\1", url)
    base, sep, _ = url.partition("?")
    return base + ("?…" if sep else "")



def retrying(call: Callable[[], Any], url: str, offset: int | None = None, length: int | None = None) -> Any:
    """`call()`, retried with exponential backoff on transient failures (`RETRIES` tries); any
    other failure, or the last, becomes the `WeightioError` `describe_failure` gives (naming `url`)."""
    for attempt in range(RETRIES):
        try:
            return call()
        except WeightioError:
            raise
        except Exception as e:  # noqa: BLE001 - every transport's errors are sorted here
            problem = describe_failure(e)
            if not (problem.transient and attempt + 1 < RETRIES):
                raise problem.error(redact(url), offset, length) from None
        time.sleep(BACKOFF * 2 ** attempt)
    raise AssertionError("unreachable")


class Failure:
    """A transport error sorted: whether to retry it, and the `WeightioError` it becomes."""

    def __init__(self, status: int | None, detail: str, *, transient: bool, changed: bool = False,
                 ignores_range: bool = False) -> None:
        self.status, self.detail, self.transient = status, detail, transient
        self.changed, self.ignores_range = changed, ignores_range

    def error(self, url: str, offset: int | None = None, length: int | None = None) -> WeightioError:
        where = f" (bytes {offset}..{offset + length})" if offset is not None and length is not None else ""
        if self.changed:
            return CorruptFileError(f"changed since it was opened{where}: the server answered HTTP {self.status} "
                                    "(its ETag no longer matches); open it again", path=url)
        if self.ignores_range:
            return InputError("the server ignores Range requests (it answers the whole file to a range request); "
                              "weightio reads remote files by range only: download the file first", path=url)
        status = self.status
        if status in (401, 403):
            return InputError(f"access denied (HTTP {status}){where}: check your credentials (HF_TOKEN, the AWS "
                              "credential chain, or storage_options=)", path=url, errno=13)
        if status == 404:
            return InputError(f"not found (HTTP 404){where}", path=url, errno=2)
        if status is not None:
            return InputError(f"the server answered HTTP {status}{where}: {self.detail}", path=url)
        return InputError(f"cannot read{where}: {self.detail}", path=url)


_TRANSIENT_STATUS = {408, 425, 429, 500, 502, 503, 504}


def describe_failure(error: BaseException) -> Failure:
    """Sort an exception of any transport (aiohttp, httpx, botocore, fsspec, OSError) into a `Failure`."""
    status = _status_of(error)
    detail = scrub(_first_line(error))
    if status == 412 or type(error).__name__ == "FileExpired":  # s3fs's word for a failed If-Match
        return Failure(status or 412, detail, transient=False, changed=True)
    if isinstance(error, ValueError) and "support range requests" in str(error):
        return Failure(None, detail, transient=False, ignores_range=True)
    if status is not None:
        reason = getattr(error, "message", None)  # aiohttp's reason phrase (its str repeats the status and URL)
        if type(error).__name__ == "ClientResponseError" and isinstance(reason, str) and reason.strip():
            detail = scrub(reason.strip()[:300])
        return Failure(status, detail, transient=status in _TRANSIENT_STATUS)
    if isinstance(error, FileNotFoundError):
        return Failure(404, detail, transient=False)
    if isinstance(error, PermissionError):
        return Failure(403, detail, transient=False)
    names = {cls.__name__ for cls in type(error).__mro__}
    transient = bool(names & {"ClientConnectionError", "ServerDisconnectedError", "ClientPayloadError",
                              "TimeoutError", "TimeoutException", "NetworkError", "ConnectError", "ReadTimeout",
                              "ConnectTimeout", "RemoteProtocolError", "ConnectionError", "EndpointConnectionError",
                              "ReadTimeoutError", "IncompleteReadError", "ConnectionResetError",
                              "ResponseStreamingError"})
    return Failure(None, f"{type(error).__name__}: {detail}", transient=transient)


def _status_of(error: BaseException) -> int | None:
    """The HTTP status an exception carries, whatever its library."""
    for candidate in (error, getattr(error, "__cause__", None), getattr(error, "__context__", None)):
        if candidate is None:
            continue
        status = getattr(candidate, "status", None)  # aiohttp
        if isinstance(status, int):
            return status
        response = getattr(candidate, "response", None)
        code = getattr(response, "status_code", None)  # httpx / requests
        if isinstance(code, int):
            return code
        if isinstance(response, dict):  # botocore ClientError
            meta = response.get("ResponseMetadata", {})
            code = meta.get("HTTPStatusCode") if isinstance(meta, dict) else None
            if isinstance(code, int):
                return code
            err = response.get("Error", {})
            if isinstance(err, dict) and str(err.get("Code", "")).isdigit():
                return int(err["Code"])
            if isinstance(err, dict) and err.get("Code") in ("PreconditionFailed",):
                return 412
            if isinstance(err, dict) and err.get("Code") in ("NoSuchKey", "NoSuchBucket", "404"):
                return 404
            if isinstance(err, dict) and err.get("Code") in ("AccessDenied", "InvalidAccessKeyId",
                                                               "SignatureDoesNotMatch", "403"):
                return 403
    return None


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:300] if text else type(error).__name__


_SECRETS = re.compile(r"(hf_[A-Za-z0-9]{6,}|(?i:signature|token|x-amz-[a-z-]+|sig|key)=[^&\s]+|//[^/@\s]+@)")


def scrub(text: str) -> str:
    """Remove tokens, signatures and URL credentials from a message."""
    return _SECRETS.sub(lambda m: "//***@" if m.group(0).startswith("//") else
                        (m.group(0).split("=")[0] + "=***" if "=" in m.group(0) else "hf_***"), text)
