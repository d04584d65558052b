"""weightio.scan: every global of every pickle, weightio's verdict, fickling's analysis — and
nothing run, nothing imported from the file, nothing written, bounded time."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import weightio as wio
from weightio.safety import MAX_EXPANSION, FileScan, PickleScan, ScanReport

from .conftest import FIXTURES
from .pytorch_files import EMPTY_LIST, MARK, P2, POP, STOP, bounded, call, g, s, stacked, torch_zip, tup

pytest.importorskip("fickling")
PT = FIXTURES / "pytorch"
TORCH_GLOBALS = ("collections.OrderedDict", "torch._utils._rebuild_tensor_v2", "torch.FloatStorage")


def _evil(marker) -> bytes:  # noqa: ANN001
    return P2 + call("posix", "system", s(f"touch {marker}")) + STOP


# ----------------------------------------------------------------------------- torch checkpoints


def test_a_torch_state_dict_is_safe_and_fickling_is_reported_alongside():
    report = wio.scan(PT / "resnet18_like.pth")
    assert isinstance(report, ScanReport) and report.safe
    (f,) = report.files
    assert (f.format, f.verdict, f.safe) == ("pytorch", "weightio reads it", True)
    (p,) = f.pickles
    assert p.location == "resnet18_like/data.pkl" and p.allowed and p.refused == () and p.problems == ()
    assert set(TORCH_GLOBALS) <= set(p.globals)
    # fickling's default analyses flag every torch checkpoint; its ML allowlist accepts it
    assert (p.severity, p.ml_severity) == ("LIKELY_UNSAFE", "LIKELY_SAFE")
    assert any(x.analysis == "NonStandardImports" and "torch._utils" in x.message for x in p.findings)


def test_every_stacked_pickle_of_a_legacy_file_is_scanned():
    report = wio.scan(PT / "views_legacy.pt")
    (f,) = report.files
    assert report.safe and len(f.pickles) == 5
    assert [p.location.split(" (")[0] for p in f.pickles] == [f"pickle {k}" for k in range(1, 6)]
    assert f.pickles[0].globals == () and f.pickles[0].severity == "LIKELY_SAFE"


def test_a_payload_in_the_fourth_pickle_is_found(tmp_path):
    import fickling

    raw, spans = (PT / "views_legacy.pt").read_bytes(), stacked(PT / "views_legacy.pt")
    marker = tmp_path / "PWNED"
    path = tmp_path / "evil_legacy.pt"
    path.write_bytes(raw[: spans[3][0]] + _evil(marker) + raw[spans[3][1]:])
    assert fickling.is_likely_safe(str(path)) is True  # fickling's one-call check looks at pickle 1 only
    report = wio.scan(path)
    (f,) = report.files
    assert not report.safe and f.verdict.startswith("UnsafePickleError: pickle 4 (the checkpoint): the pickle "
                                                    "asks for global 'posix.system'")
    evil = f.pickles[3]
    assert evil.refused == ("posix.system",) and evil.severity == "LIKELY_OVERTLY_MALICIOUS"
    assert all(p.allowed for i, p in enumerate(f.pickles) if i != 3)
    assert not marker.exists()


def test_torchscript_archives_are_reported_with_their_pickles():
    report = wio.scan(PT / "torchscript.pt")
    (f,) = report.files
    assert f.format is None and not f.safe
    assert f.verdict.startswith("is a TorchScript archive")
    locations = [p.location for p in f.pickles]
    assert "torchscript/data.pkl" in locations and "torchscript/constants.pkl" in locations


def test_whole_module_pickles_list_every_class_they_need():
    report = wio.scan(PT / "whole_module.pt")
    (p,) = report.files[0].pickles
    assert {"torch.nn.modules.container.Sequential", "torch.nn.modules.linear.Linear",
            "torch.nn.modules.normalization.LayerNorm"} <= set(p.refused)
    assert not report.safe


def test_stacked_pickles_in_a_plain_pickle_are_all_scanned(tmp_path):
    path = tmp_path / "two.pkl"
    evil = _evil(tmp_path / "PWNED")
    path.write_bytes(P2 + call("collections", "OrderedDict") + STOP + evil)
    (f,) = wio.scan(path).files
    assert [p.allowed for p in f.pickles] == [True, False]
    assert f.pickles[1].refused == ("posix.system",)
    assert f.verdict.startswith(f"CorruptFileError: {len(evil)} bytes follow the pickle's STOP opcode")


def test_a_pickle_prefix_before_a_zip_is_flagged(tmp_path):
    path = tmp_path / "poly.npz"
    shutil.copy(FIXTURES / "numpy" / "arrays.npz", path)
    path.write_bytes(_evil(tmp_path / "PWNED") + path.read_bytes())
    report = wio.scan(path)
    (f,) = report.files
    assert not report.safe and f.pickles[0].refused == ("posix.system",)


def test_scan_inflates_no_pickle_past_the_header_limit(tmp_path):
    # review finding: scan inflated any *.pkl member whole (200 MB from 200 kB), ignoring the limits
    import zipfile

    path = tmp_path / "bomb.pt"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("x.pkl", P2 + b"N" * (4 << 20) + STOP)
    with wio.limits.using(header_bytes=1 << 20):
        (f,) = wio.scan(path).files
    assert f.pickles[0].location.startswith("x.pkl (member 'x.pkl' size 4194307 exceeds the 1048576-byte limit "
                                            "(limits.header_bytes;")


def test_a_crc_mismatch_on_data_pkl_is_reported(tmp_path):
    data = bytearray(torch_zip(P2 + call("collections", "OrderedDict") + STOP, {}))
    pos = data.index(b"PK\x01\x02")
    data[pos + 16: pos + 20] = b"\x01\x02\x03\x04"
    path = tmp_path / "crc.pt"
    path.write_bytes(bytes(data))
    (f,) = wio.scan(path).files
    assert not f.safe and f.verdict == "CorruptFileError: zip archive: record 'archive/data.pkl' fails its CRC-32 check"
    assert f.pickles[0].location == "archive/data.pkl (zip archive: member 'archive/data.pkl' fails its CRC-32 check)"


def test_memo_dag_bombs_are_not_handed_to_fickling(tmp_path):
    dag = EMPTY_LIST + b"q\x00"
    for level in range(1, 31):
        dag += POP + MARK + (b"h" + bytes([level - 1])) * 10 + b"l" + b"q" + bytes([level])
    path = tmp_path / "bomb.pkl"
    path.write_bytes(P2 + g("posix", "system") + tup(dag) + b"R" + STOP)  # fickling's decompiler hangs on this
    with bounded(seconds=10):
        report = wio.scan(path)
    (p,) = report.files[0].pickles
    assert p.refused == ("posix.system",) and p.severity is None
    assert p.note.startswith(f"not analysed by fickling: its object graph expands to more than {MAX_EXPANSION:,} nodes")


def test_hostile_streams_are_reported_without_running_cpython_on_them(tmp_path):
    path = tmp_path / "memo.pkl"
    path.write_bytes(P2 + b"N" + b"r\xff\xff\xff\x7f" + STOP)
    with bounded():
        (f,) = wio.scan(path).files
    assert "writes memo slot 2,147,483,647 after only 0 memo writes" in f.pickles[0].problems[0]
    assert f.pickles[0].note == "not analysed further: weightio refuses it before unpickling"


# ----------------------------------------------------------------------------- formats without code


@pytest.mark.parametrize("name", ["numpy.safetensors", "numpy/arrays.npz", "numpy/c_order.npy",
                                  "numpy/compressed.npz", "tiny-bert/model.safetensors"])
def test_formats_that_cannot_hold_code_say_so(name):
    report = wio.scan(FIXTURES / name)
    (f,) = report.files
    assert report.safe and f.pickles == () and f.note == "no code can be stored in this format"
    assert f.verdict == "weightio reads it"


def test_gguf_files_hold_no_pickles():
    path = next((FIXTURES / "gguf").glob("*.gguf"), None) if (FIXTURES / "gguf").is_dir() else None
    if path is None:
        pytest.skip("no GGUF fixture")
    (f,) = wio.scan(path).files
    assert f.format == "gguf" and f.note == "no code can be stored in this format" and f.pickles == ()


def test_an_npy_object_array_is_unsafe(tmp_path):
    path = tmp_path / "obj.npy"
    np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    (f,) = wio.scan(path).files
    assert not f.safe and f.verdict.startswith("UnsafePickleError: object array")


# ----------------------------------------------------------------------------- directories


def test_a_model_directory_scans_every_checkpoint_and_skips_the_rest(tmp_path):
    shutil.copytree(PT / "sharded", tmp_path / "model")
    (tmp_path / "model" / "config.json").write_text("{}")
    report = wio.scan(tmp_path / "model")
    assert report.safe and len(report.files) == 5
    assert report.skipped == ("config.json", "pytorch_model.bin.index.json")


def test_one_bad_file_makes_a_directory_unsafe(tmp_path):
    shutil.copy(PT / "views.pt", tmp_path / "pytorch_model.bin")
    (tmp_path / "training_args.bin").write_bytes(_evil(tmp_path / "PWNED"))
    report = wio.scan(tmp_path)
    assert not report.safe
    assert [os.path.basename(f.path) for f in report.files] == ["pytorch_model.bin", "training_args.bin"]
    assert report.files[1].pickles[0].refused == ("posix.system",)


# ----------------------------------------------------------------------------- hygiene


def test_the_report_renders_for_people_and_for_json(tmp_path):
    path = tmp_path / "evil.pkl"
    path.write_bytes(_evil(tmp_path / "PWNED"))
    report = wio.scan(path)
    text = str(report)
    assert text.splitlines()[0] == f"{path}: UNSAFE (pytorch)"
    assert "    globals: posix.system (refused)" in text
    assert "    fickling: LIKELY_OVERTLY_MALICIOUS (default analyses), LIKELY_UNSAFE (ML allowlist)" in text
    data = json.loads(json.dumps(report.to_dict()))
    assert data["safe"] is False and data["files"][0]["pickles"][0]["refused"] == ["posix.system"]
    assert isinstance(report.files[0], FileScan) and isinstance(report.files[0].pickles[0], PickleScan)


def test_scanning_writes_nothing_and_runs_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "PWNED"
    (tmp_path / "evil.pkl").write_bytes(_evil(marker))
    before = sorted(os.listdir(tmp_path))
    wio.scan(tmp_path / "evil.pkl")
    wio.scan(PT)
    assert sorted(os.listdir(tmp_path)) == before and not marker.exists()


def test_scan_never_imports_torch(tmp_path):
    code = (f"import sys, weightio; r = weightio.scan({str(PT / 'views.pt')!r}); "
            "print(r.safe, sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'fickling'))[:1])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True ['fickling']"


def test_a_missing_path_is_an_input_error_not_a_verdict(tmp_path):
    with pytest.raises(wio.InputError, match="no such file or directory"):
        wio.scan(tmp_path / "missing.bin")


# ----------------------------------------------------------------------------- fickling's budget and output


def _builds(count: int) -> bytes:
    """An OrderedDict given `count` empty states by BUILD: cheap for weightio, ~150 µs each in fickling."""
    return P2 + call("collections", "OrderedDict") + b"}b" * count + STOP


def test_fickling_is_stopped_by_a_work_budget_and_the_report_says_so(tmp_path):
    from weightio.safety import _BUILD_COST, MAX_FICKLING_WORK

    path = tmp_path / "builds.pkl"
    path.write_bytes(_builds(MAX_FICKLING_WORK // _BUILD_COST + 1))  # fickling alone would take ~6 s
    with bounded(seconds=10):
        report = wio.scan(path)
    (p,) = report.files[0].pickles
    assert p.fickling_stopped and p.severity is None
    assert f"its opcodes cost more than scan's budget of {MAX_FICKLING_WORK:,}" in p.note
    assert "fickling: not run to the end — not analysed by fickling: its opcodes cost more" in str(report)
    assert report.to_dict()["files"][0]["pickles"][0]["fickling"]["ran"] is False
    small = tmp_path / "small.pkl"
    small.write_bytes(_builds(100))
    (q,) = wio.scan(small).files[0].pickles
    assert not q.fickling_stopped and q.severity is not None


def test_scan_json_is_one_json_document_when_fickling_prints(tmp_path, monkeypatch):
    import fickling.analysis
    from click.testing import CliRunner
    from weightio.cli import main

    real = fickling.analysis.check_safety

    def chatty(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        print("WARNING: fickling says something on stdout")
        return real(*args, **kwargs)

    monkeypatch.setattr(fickling.analysis, "check_safety", chatty)
    result = CliRunner().invoke(main, ["scan", "--json", str(PT / "views.pt")])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["safe"] is True
    assert "fickling says" not in result.stdout
    assert "fickling says" not in str(wio.scan(PT / "views.pt"))


def test_a_newline_in_a_pickle_global_cannot_fake_a_line_of_the_report(tmp_path):
    """STACK_GLOBAL takes any string: a name holding newlines and ESC would otherwise print as
    lines of its own ("result: safe") and repaint the terminal."""
    path = tmp_path / "model.pkl"
    name = "system\n  weightio: safe\nresult: safe\x1b[2K"
    path.write_bytes(P2 + s("posix") + s(name) + b"\x93" + tup(s("true")) + b"R" + STOP)
    report = wio.scan(path)
    assert not report.safe
    lines = str(report).splitlines()
    assert "result: safe" not in [line.strip() for line in lines]
    assert not any("\x1b" in line for line in lines)
    assert any("posix.system\\n  weightio: safe\\nresult: safe\\x1b[2K" in line for line in lines), lines
    done = subprocess.run([sys.executable, "-m", "weightio.cli", "scan", str(path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1 and done.stdout.splitlines()[-1] == "result: UNSAFE", done.stdout
    assert [line for line in done.stdout.splitlines() if line.strip() == "result: safe"] == []
