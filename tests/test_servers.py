"""The loopback servers themselves: Range forms, byte accounting, knobs, and the real clients against them.

The remote-checkpoint tests assert bytes and requests measured by these servers, so the servers'
own numbers are checked here against raw ``http.client`` exchanges and the ecosystem's clients
(fsspec's HTTP filesystem, huggingface_hub's ``HfFileSystem`` and ``hf_hub_download``, s3fs).
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from .hubserver import Repo, git_blob_id, lfs_pointer
from .servers import byte_range

DATA = bytes(range(256)) * 40  # 10240 bytes
N = len(DATA)
MAIN = "1" * 40
WEIGHTS = hashlib.sha256(DATA).hexdigest()
CONFIG = b'{"model_type": "bert", "hidden_size": 32}' * 10


def fetch(url: str, method: str = "GET", headers: dict | None = None, body: bytes | None = None):
    """One raw exchange: (status, headers with lower-cased names, body)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        conn.request(method, parts.path + (f"?{parts.query}" if parts.query else ""), body=body,
                     headers=headers or {})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def _repos() -> dict[tuple[str, str], Repo]:
    files = {"model.safetensors": DATA, "config.json": CONFIG, "sub/a/b.json": b"{}", "sub/x.safetensors": b"x" * 100}
    return {("model", "org/model"): Repo({MAIN: files}, {"main": MAIN})}


# ----------------------------------------------------------------------------- Range semantics


RANGES = [  # header -> status, Content-Range, body slice
    ("bytes=0-9", 206, f"bytes 0-9/{N}", slice(0, 10)),
    ("bytes=100-", 206, f"bytes 100-{N - 1}/{N}", slice(100, N)),
    ("bytes=-5", 206, f"bytes {N - 5}-{N - 1}/{N}", slice(N - 5, N)),
    ("bytes=-99999", 206, f"bytes 0-{N - 1}/{N}", slice(0, N)),
    (f"bytes={N - 10}-999999", 206, f"bytes {N - 10}-{N - 1}/{N}", slice(N - 10, N)),
    (f"bytes={N - 1}-{N - 1}", 206, f"bytes {N - 1}-{N - 1}/{N}", slice(N - 1, N)),
    (f"bytes={N}-", 416, f"bytes */{N}", slice(0, 0)),
    (f"bytes={N + 5}-{N + 9}", 416, f"bytes */{N}", slice(0, 0)),
    ("bytes=-0", 416, f"bytes */{N}", slice(0, 0)),
    ("bytes=5-2", 200, None, slice(0, N)),  # invalid: ignored
    ("bytes=0-1,4-5", 200, None, slice(0, N)),  # multi-range: answered whole
    ("items=0-9", 200, None, slice(0, N)),  # another unit: ignored
    ("bytes=x-9", 200, None, slice(0, N)),  # malformed: ignored
]


@pytest.fixture(params=["http", "hub-cdn", "hub-resolve"])
def file_url(request):
    """(server, URL) of a file holding DATA on each server and route with Range support."""
    if request.param == "http":
        http_server = request.getfixturevalue("http_server")
        return http_server, http_server.add("dir/model.bin", DATA)
    files = {"model.safetensors": DATA, "data.txt": DATA}
    hub = request.getfixturevalue("serve_hub")({("model", "org/model"): Repo({MAIN: files}, {"main": MAIN})})
    if request.param == "hub-resolve":
        return hub, hub.file_url("org/model", "data.txt")
    status, headers, _ = fetch(hub.file_url("org/model", "model.safetensors"), "HEAD")
    assert status == 302 and headers["x-linked-etag"] == f'"{WEIGHTS}"'
    hub.reset()
    return hub, headers["location"]


@pytest.mark.parametrize("wanted,status,content_range,part", RANGES, ids=[r[0] for r in RANGES])
def test_each_range_form_is_answered_exactly(file_url, wanted, status, content_range, part):
    server, url = file_url
    got, headers, body = fetch(url, headers={"Range": wanted})
    assert (got, headers.get("content-range"), body) == (status, content_range, DATA[part])
    assert headers["accept-ranges"] == "bytes" and int(headers["content-length"]) == len(body)
    assert [(r.method, r.range, r.status, r.bytes) for r in server.requests] == [("GET", wanted, status, len(body))]
    assert server.bytes_sent == len(body)


def test_head_with_a_range_sends_headers_only(file_url):
    server, url = file_url
    status, headers, body = fetch(url, "HEAD", {"Range": "bytes=10-19"})
    assert (status, headers["content-range"], headers["content-length"], body) == (206, f"bytes 10-19/{N}", "10", b"")
    assert server.bytes_sent == 0 and server.count("HEAD") == 1


@pytest.mark.parametrize("wanted,status", [("bytes=0-", 416), ("bytes=-1", 416), (None, 200)])
def test_an_empty_file_satisfies_no_range(http_server, wanted, status):
    url = http_server.add("empty", b"")
    got, headers, body = fetch(url, headers={"Range": wanted} if wanted else {})
    assert (got, body, http_server.bytes_sent) == (status, b"", 0)
    assert headers.get("content-range") == ("bytes */0" if status == 416 else None)


def test_byte_range_parser():
    assert byte_range(None, 10) is None and byte_range("bytes=2-4", 10) == (2, 5)
    assert byte_range("bytes = 2-", 10) == (2, 10) and byte_range("BYTES=-3", 10) == (7, 10)
    assert byte_range("bytes=²-3", 10) is None  # only ASCII digits


# ----------------------------------------------------------------------------- knobs


def test_delay_applies_to_each_request(http_server):
    url = http_server.add("f", DATA)
    http_server.delay = 0.05
    start = time.monotonic()
    for _ in range(2):
        assert fetch(url, headers={"Range": "bytes=0-0"})[0] == 206
    assert time.monotonic() - start >= 0.1
    assert http_server.idle() and all(r.finished - r.started >= 0.05 for r in http_server.requests)


def test_requests_are_answered_concurrently(http_server):
    url = http_server.add("f", DATA)
    http_server.delay = 0.2
    threads = [threading.Thread(target=fetch, args=(url,), kwargs={"headers": {"Range": "bytes=0-9"}})
               for _ in range(4)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert time.monotonic() - start < 0.6  # 4 x 0.2 s in parallel, not in a row
    assert http_server.peak_in_flight == 4 and http_server.bytes_sent == 40


def test_transient_failures_apply_then_clear(file_url):
    server, url = file_url
    server.failures[urlsplit(url).path] = [503, 500]
    assert [fetch(url)[0] for _ in range(3)] == [503, 500, 200]
    assert server.failures == {}
    assert [(r.status, r.bytes > 0) for r in server.requests] == [(503, True), (500, True), (200, True)]
    assert server.requests[-1].bytes == N


def test_a_permanent_failure_stays_until_removed(http_server):
    url = http_server.add("f", DATA)
    http_server.failures["/f"] = 404
    assert [fetch(url)[0] for _ in range(2)] == [404, 404]
    del http_server.failures["/f"]
    assert fetch(url)[0] == 200


def test_ignore_range_answers_the_whole_body(file_url):
    server, url = file_url
    server.ignore_range = True
    status, headers, body = fetch(url, headers={"Range": "bytes=0-9"})
    assert (status, "content-range" in headers, body) == (200, False, DATA)
    assert server.bytes_sent == N


def test_reset_clears_the_log(http_server):
    fetch(http_server.add("f", DATA))
    assert (http_server.count(), http_server.bytes_sent) == (1, N)
    http_server.reset()
    assert (http_server.count(), http_server.bytes_sent, http_server.requests) == (0, 0, [])


# ----------------------------------------------------------------------------- ETag and conditional requests


def test_a_changed_file_fails_if_match(http_server):
    url = http_server.add("f", DATA)
    _, first, _ = fetch(url, "HEAD")
    assert first["etag"] == f'"{WEIGHTS}"' and first["last-modified"].endswith("GMT")
    assert fetch(url, headers={"If-Match": first["etag"], "Range": "bytes=0-3"})[0] == 206
    http_server.replace("f", DATA[:-1] + b"!")
    status, headers, body = fetch(url, headers={"If-Match": first["etag"], "Range": "bytes=0-3"})
    assert (status, body, http_server.requests[-1].bytes) == (412, b"", 0)
    assert headers["etag"] != first["etag"] and headers["last-modified"] != first["last-modified"]
    assert fetch(url, headers={"If-Match": f'"x", {headers["etag"]}'})[0] == 200
    assert fetch(url, headers={"If-None-Match": headers["etag"]})[:3:2] == (304, b"")
    stale = fetch(url, headers={"If-Range": first["etag"], "Range": "bytes=0-3"})  # the client's copy is stale
    assert (stale[0], len(stale[2])) == (200, N)


def test_a_changed_hub_file_changes_etag_and_size(serve_hub):
    hub = serve_hub(_repos())
    url = hub.file_url("org/model", "model.safetensors")
    _, before, _ = fetch(url, "HEAD")
    hub.replace_file("org/model", "model.safetensors", DATA + b"more")
    _, after, _ = fetch(url, "HEAD")
    assert before["x-linked-size"] == str(N) and after["x-linked-size"] == str(N + 4)
    assert after["x-repo-commit"] == before["x-repo-commit"] == MAIN  # same commit, new content
    assert fetch(after["location"], headers={"If-Match": before["x-linked-etag"]})[0] == 412
    assert fetch(before["location"])[2] == DATA  # the CDN is content-addressed: the old blob stays
    config = hub.file_url("org/model", "config.json")
    _, old, _ = fetch(config, "HEAD")
    hub.replace_file("org/model", "config.json", b"{}")
    assert fetch(config, headers={"If-Match": old["etag"]})[0] == 412


# ----------------------------------------------------------------------------- plain HTTP: folders, fsspec, auth


def test_fsspec_http_against_the_server(http_server):
    fsspec = pytest.importorskip("fsspec")
    http_server.add("m/model.safetensors", DATA)
    http_server.add("m/sub/x.json", b"{}")
    fs = fsspec.filesystem("http", skip_instance_cache=True)
    base = http_server.url
    assert fs.ls(base + "/", detail=False) == [base + "/m/"]
    assert sorted(fs.ls(base + "/m/", detail=False)) == [base + "/m/model.safetensors", base + "/m/sub/"]
    assert fs.info(base + "/m/model.safetensors")["size"] == N
    http_server.reset()
    assert fs.cat_file(base + "/m/model.safetensors", 100, 200) == DATA[100:200]
    assert [(r.method, r.range, r.status, r.bytes) for r in http_server.requests] == [
        ("GET", "bytes=100-199", 206, 100)]
    assert http_server.bytes_sent == 100


def test_a_local_folder_is_served_without_escaping_it(http_server, tmp_path):
    (tmp_path / "served" / "sub").mkdir(parents=True)
    (tmp_path / "served" / "sub" / "w.bin").write_bytes(DATA)
    (tmp_path / "secret").write_bytes(b"secret")
    http_server.root = tmp_path / "served"
    assert fetch(http_server.url + "/sub/w.bin", headers={"Range": "bytes=-4"})[2] == DATA[-4:]
    assert b'<a href="/sub/w.bin">' in fetch(http_server.url + "/sub/")[2]
    assert b'<a href="/sub/">' in fetch(http_server.url + "/")[2]
    for escape in ("/../secret", "/%2e%2e/secret", "/sub/../../secret"):
        assert fetch(http_server.url + escape)[0] == 404


def test_credentials_are_required_when_set(http_server):
    fsspec = pytest.importorskip("fsspec")
    url = http_server.add("f", DATA)
    http_server.token = "t0ken"
    status, headers, _ = fetch(url)
    assert (status, headers["www-authenticate"]) == (401, 'Basic realm="loopback"')
    assert fetch(url, headers={"Authorization": "Bearer wrong"})[0] == 403
    assert fetch(url, headers={"Authorization": "Bearer t0ken"})[0] == 200
    http_server.auth = ("user", "pa55")
    basic = "Basic " + base64.b64encode(b"user:pa55").decode()
    fs = fsspec.filesystem("http", skip_instance_cache=True, headers={"Authorization": basic})
    assert fs.cat_file(url, 0, 4) == DATA[:4]


# ----------------------------------------------------------------------------- the fake Hub


def test_tree_lists_like_the_hub(serve_hub):
    hub = serve_hub(_repos())
    status, _, body = fetch(f"{hub.url}/api/models/org/model/tree/main")
    top = json.loads(body)
    assert status == 200 and [(e["type"], e["path"]) for e in top] == [
        ("directory", "sub"), ("file", "config.json"), ("file", "model.safetensors")]
    pointer = lfs_pointer(DATA)
    assert top[2] == {"type": "file", "oid": git_blob_id(pointer), "size": N, "path": "model.safetensors",
                      "lfs": {"oid": WEIGHTS, "size": N, "pointerSize": len(pointer)}}
    assert top[1] == {"type": "file", "oid": git_blob_id(CONFIG), "size": len(CONFIG), "path": "config.json"}
    deep = json.loads(fetch(f"{hub.url}/api/models/org/model/tree/{MAIN}/sub%2Fa?recursive=true&expand=true")[2])
    assert [e["path"] for e in deep] == ["sub/a/b.json"] and deep[0]["lastCommit"]["id"] == MAIN
    missing = fetch(f"{hub.url}/api/models/org/model/tree/main/nope")
    assert (missing[0], missing[1]["x-error-code"]) == (404, "EntryNotFound")
    assert fetch(f"{hub.url}/api/models/org/model/tree/v9")[1]["x-error-code"] == "RevisionNotFound"


@pytest.mark.parametrize("content_type,body", [
    ("application/x-www-form-urlencoded", b"paths=config.json&paths=nope&paths=sub&expand=False"),
    ("application/json", json.dumps({"paths": ["config.json", "nope", "sub"], "expand": False}).encode())])
def test_paths_info_takes_a_form_or_json(serve_hub, content_type, body):
    hub = serve_hub(_repos())
    status, _, answer = fetch(f"{hub.url}/api/models/org/model/paths-info/main", "POST",
                              {"Content-Type": content_type}, body)
    assert status == 200 and [(e["type"], e["path"]) for e in json.loads(answer)] == [
        ("file", "config.json"), ("directory", "sub")]


def test_hf_file_system_against_the_hub(serve_hub):
    hf = pytest.importorskip("huggingface_hub")
    hub = serve_hub(_repos())
    fs = hf.HfFileSystem(endpoint=hub.url, token=False, skip_instance_cache=True)
    assert fs.ls("org/model", detail=False) == ["org/model/sub", "org/model/config.json", "org/model/model.safetensors"]
    assert fs.info("org/model/model.safetensors")["size"] == N
    assert fs.find("org/model/sub") == ["org/model/sub/a/b.json", "org/model/sub/x.safetensors"]
    hub.reset()
    with fs.open("org/model/model.safetensors", "rb", cache_type="none") as f:
        f.seek(1000)
        assert f.read(24) == DATA[1000:1024]
    assert [(r.method, r.range, r.status, r.bytes) for r in hub.requests] == [
        ("GET", "bytes=1000-1023", 302, 0), ("GET", "bytes=1000-1023", 206, 24)]
    hub.reset()
    assert fs.cat("org/model/config.json") == CONFIG
    assert hub.bytes_sent == len(CONFIG)
    info = hf.HfApi(endpoint=hub.url, token=False).model_info("org/model", files_metadata=True)
    assert {s.rfilename: s.size for s in info.siblings}["model.safetensors"] == N


def test_hf_hub_download_against_the_hub(serve_hub, tmp_path):
    hf = pytest.importorskip("huggingface_hub")
    hub = serve_hub(_repos())
    path = hf.hf_hub_download("org/model", "model.safetensors")
    assert path.startswith(str(tmp_path / "hf-cache")) and Path(path).read_bytes() == DATA
    assert hub.sent(contains="/cdn/") == N and hub.count("GET", "/cdn/") == 1
    assert hf.list_repo_files("org/model") == ["config.json", "model.safetensors", "sub/a/b.json",
                                               "sub/x.safetensors"]


def test_transformers_loads_from_the_hub_then_offline(serve_hub, monkeypatch):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    import huggingface_hub.constants

    from .conftest import FIXTURES
    from .hubserver import repo_from_folder

    hub = serve_hub({("model", "weightio/tiny-bert"): repo_from_folder(FIXTURES / "tiny-bert", commit=MAIN)})
    model = transformers.AutoModel.from_pretrained("weightio/tiny-bert")
    transformers.AutoTokenizer.from_pretrained("weightio/tiny-bert")
    assert [(r.path.split("?")[0], r.status) for r in hub.matching(contains="/tree/")] == [
        ("/api/models/weightio/tiny-bert/tree/main/additional_chat_templates", 404),
        ("/api/models/weightio/tiny-bert/tree/main", 200)]
    assert not hub.matching(status=500) and hub.sent(contains="/cdn/") == (FIXTURES / "tiny-bert" /
                                                                          "model.safetensors").stat().st_size
    hub.stop()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    offline = transformers.AutoModel.from_pretrained("weightio/tiny-bert")
    assert offline.config.to_dict() == model.config.to_dict()


# ----------------------------------------------------------------------------- S3 (moto)


@pytest.fixture
def s3(s3_server):
    s3fs = pytest.importorskip("s3fs")
    s3_server.put("bucket", "m/model.safetensors", DATA)
    s3_server.put("bucket", "m/config.json", CONFIG)
    return s3_server, s3fs.S3FileSystem(skip_instance_cache=True, **s3_server.storage_options)


def test_s3fs_against_moto_counts_bytes(s3):
    server, fs = s3
    info = fs.info("bucket/m/model.safetensors")
    assert info["size"] == N and info["ETag"] == server.etag("bucket", "m/model.safetensors")
    assert fs.ls("bucket/m", detail=False) == ["bucket/m/config.json", "bucket/m/model.safetensors"]
    server.reset()
    assert fs.cat_file("bucket/m/model.safetensors", start=100, end=200) == DATA[100:200]
    assert [(r.method, r.range, r.status, r.bytes) for r in server.requests] == [("GET", "bytes=100-199", 206, 100)]
    assert server.bytes_sent == 100


@pytest.fixture(scope="module")
def boto3_client(_s3_session_server):
    boto3 = pytest.importorskip("boto3")
    return boto3.client("s3", endpoint_url=_s3_session_server.url, aws_access_key_id="testing",
                        aws_secret_access_key="testing", region_name="us-east-1")


@pytest.mark.parametrize("wanted,status,content_range,part", [
    ("bytes=0-9", 206, f"bytes 0-9/{N}", slice(0, 10)),
    ("bytes=100-", 206, f"bytes 100-{N - 1}/{N}", slice(100, N)),
    ("bytes=-5", 206, f"bytes {N - 5}-{N - 1}/{N}", slice(N - 5, N)),
    (f"bytes={N - 10}-999999", 206, f"bytes {N - 10}-{N - 1}/{N}", slice(N - 10, N)),
    ("bytes=5-2", 200, None, slice(0, N)),
    ("bytes=0-1,4-5", 200, None, slice(0, N))])
def test_s3_range_forms(s3, boto3_client, wanted, status, content_range, part):
    server, _ = s3
    server.reset()
    answer = boto3_client.get_object(Bucket="bucket", Key="m/model.safetensors", Range=wanted)
    body = answer["Body"].read()
    assert (answer["ResponseMetadata"]["HTTPStatusCode"], answer.get("ContentRange"), body) == (
        status, content_range, DATA[part])
    assert [(r.range, r.status, r.bytes) for r in server.requests] == [(wanted, status, len(body))]


@pytest.mark.parametrize("wanted", [f"bytes={N}-", f"bytes={N}-{N + 9}", "bytes=-0"])
def test_s3_unsatisfiable_ranges(s3, boto3_client, wanted):
    from botocore.exceptions import ClientError

    server, fs = s3
    with pytest.raises(ClientError) as info:
        boto3_client.get_object(Bucket="bucket", Key="m/model.safetensors", Range=wanted)
    assert info.value.response["Error"]["Code"] == "InvalidRange" and server.requests[-1].status == 416
    with pytest.raises(OSError, match="range is not satisfiable"):  # what s3fs makes of it
        fs.cat_file("bucket/m/model.safetensors", start=N, end=N + 10)


def test_s3_knobs_and_the_environment(s3, boto3_client):
    import fsspec
    from botocore.exceptions import ClientError

    server, fs = s3
    server.reset()
    with fsspec.open("s3://bucket/m/config.json") as f:  # no storage_options: the AWS_* variables
        assert f.read() == CONFIG
    server.reset()
    server.failures["/bucket/m/config.json"] = [503]
    server.delay = 0.02
    start = time.monotonic()
    assert fs.cat_file("bucket/m/config.json") == CONFIG  # botocore retries the 503
    assert [(r.method, r.status) for r in server.requests] == [("HEAD", 503), ("HEAD", 200), ("GET", 200)]
    assert time.monotonic() - start >= 0.06
    server.delay, server.ignore_range = 0.0, True
    server.reset()
    assert fs.cat_file("bucket/m/model.safetensors", start=0, end=10) == DATA  # s3fs returns what came
    assert server.requests[-1].status == 200 and server.bytes_sent == N
    etag = server.etag("bucket", "m/config.json")
    server.put("bucket", "m/config.json", b"{}")
    assert etag != server.etag("bucket", "m/config.json")
    with pytest.raises(ClientError) as info:
        boto3_client.get_object(Bucket="bucket", Key="m/config.json", IfMatch=etag)
    assert info.value.response["Error"]["Code"] == "PreconditionFailed" and server.requests[-1].status == 412


def test_a_client_resetting_a_kept_alive_connection_prints_nothing(http_server, capsys):
    """aiohttp may reset a kept-alive connection when its session closes: the server's thread,
    waiting there for the next request, must not print a traceback (a CLI test running in-process
    reads it as the command's own output)."""
    import socket
    import struct

    url = urlsplit(http_server.add("a.bin", b"x" * 100))
    sock = socket.create_connection((url.hostname, url.port))
    sock.sendall(b"GET " + url.path.encode() + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert sock.recv(12) == b"HTTP/1.1 200"
    time.sleep(0.3)  # the answer sent, the server's thread waits for the next request
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
    sock.close()
    time.sleep(0.3)  # the server's thread reads, meets the reset, and ends
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and "Exception occurred" not in captured.err
    assert fetch(http_server.url_for("a.bin"))[0] == 200  # still serving
