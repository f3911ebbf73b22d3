"""The profile command and the prepared device run on a faked CUDA device (no GPU here).

A fake device: ``torch.cuda`` answers as a named GPU and ``charon_search.profiling
.CudaEventTimer`` is replaced by a timer that returns 10 µs (or raises, or sleeps), as in the
GPU review's reproductions (/tmp/review_prof/fake_cli.py). The in-process tests patch with
monkeypatch; the shell-script tests install the same fake through a ``sitecustomize`` module.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pandas as pd
import pytest

import charon_search.profiling as prof
from charon_search.cli import main

REPO = Path(__file__).resolve().parents[2]
H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"


class FakeTimer:
    inner, eager_fallbacks, last_note = 10, 0, "timing: fake"
    mode, calls, sleep = "ok", 0, 0.0

    def __init__(self, **kw):
        pass

    def __call__(self, shape):
        type(self).calls += 1
        if self.mode == "fail":
            raise RuntimeError("CUDA error: no kernel image is available for execution")
        if self.mode == "sigterm" and type(self).calls == 5:
            # what `timeout` sends; only with a handler installed (else it ends pytest)
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None)
            os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(self.sleep)
        return 1e-5


@pytest.fixture
def fake_gpu(monkeypatch):
    import torch

    def use(name: str, mode: str = "ok") -> type[FakeTimer]:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: name)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
        timer = type("T", (FakeTimer,), {"mode": mode, "calls": 0})
        monkeypatch.setattr(prof, "CudaEventTimer", timer)
        return timer
    return use


# ------------------------------------------------------------------ item 3: the GPU key
def test_gpu_name_that_is_not_the_device_is_refused(fake_gpu, tmp_path, capsys):
    fake_gpu(H100)
    rc = main(["profile", "--gh100-crosscheck", "--gpu-name", "h200-sxm-141gb", "--out",
               str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and "does not match the CUDA device 'NVIDIA H100 80GB HBM3' " \
        "(h100-sxm-80gb)" in err
    assert not (tmp_path / "profile_rows.parquet").exists()
    # no --gpu-name: the detected device's key
    assert main(["profile", "--gh100-crosscheck", "--out", str(tmp_path)]) == 0
    rows = pd.read_parquet(tmp_path / "profile_rows.parquet")
    assert set(rows.gpu) == {"h100-sxm-80gb"} and len(rows) == 75
    # the override files them under the given key and says so on every row
    assert main(["profile", "--gh100-crosscheck", "--gpu-name", "h200-sxm-141gb",
                 "--force-gpu-name", "--out", str(tmp_path)]) == 0
    rows = pd.read_parquet(tmp_path / "profile_rows.parquet")
    assert set(rows.gpu) == {"h200-sxm-141gb"}
    assert rows.source.str.contains("filed as h200-sxm-141gb by --force-gpu-name").all()


def test_device_key_is_exact_for_the_lent_parts():
    from charon_search.errors import ConfigError
    from charon_search.profiling.device import gpu_key_for_device

    assert gpu_key_for_device(H100) == "h100-sxm-80gb"
    assert gpu_key_for_device(H200, expect="h200") == "h200-sxm-141gb"
    with pytest.raises(ConfigError, match="expected h200-sxm-141gb"):
        gpu_key_for_device(H100, expect="h200-sxm-141gb")
    for other in ("NVIDIA H100 PCIe", "NVIDIA H200 NVL", "NVIDIA A100-SXM4-80GB"):
        with pytest.raises(ConfigError, match="refusing"):
            gpu_key_for_device(other)


# ------------------------------------------------------------------ item 1: incremental output
def test_rows_are_on_disk_as_they_are_measured(fake_gpu, tmp_path, monkeypatch):
    fake_gpu(H200)
    seen = []
    real_add = prof.profile_shapes

    def spy(shapes, **kw):
        on_rows = kw["on_rows"]

        def check(rows):
            on_rows(rows)
            lines = (tmp_path / "profile_rows.jsonl").read_text().splitlines()
            seen.append(len(lines))
        return real_add(shapes, **{**kw, "on_rows": check})
    monkeypatch.setattr(prof, "profile_shapes", spy)
    assert main(["profile", "--grid", "--out", str(tmp_path)]) == 0
    assert seen[:3] == [1, 2, 3] and seen[-1] == 110  # one flushed line per timed shape
    assert len(pd.read_parquet(tmp_path / "profile_rows.parquet")) == 110


def test_sigterm_keeps_the_rows_measured(fake_gpu, tmp_path):
    fake_gpu(H200, "sigterm")
    rc = main(["profile", "--grid", "--out", str(tmp_path)])
    assert rc == 143
    rows = pd.read_parquet(tmp_path / "profile_rows.parquet")
    assert len(rows) == 4  # the 5th shape got SIGTERM; the four before it are kept
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"].startswith("terminated") and summary["num_rows"] == 4
    assert len((tmp_path / "profile_rows.jsonl").read_text().splitlines()) == 4


def test_a_failing_overlap_keeps_the_compute_rows(fake_gpu, tmp_path, monkeypatch, capsys):
    fake_gpu(H200)

    def boom(timer, **kw):
        raise RuntimeError("Failed to find C compiler. Please specify via CC")
    monkeypatch.setattr(prof, "measure_overlap", boom)
    assert main(["profile", "--grid", "--overlap", "--out", str(tmp_path)]) == 0
    assert len(pd.read_parquet(tmp_path / "profile_rows.parquet")) == 110
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["parts"]["overlap"] == "failed" and summary["status"] == "complete"
    assert any("C compiler" in e for e in summary["errors"])


def test_every_shape_failing_exits_nonzero(fake_gpu, tmp_path, capsys):
    fake_gpu(H200, "fail")
    assert main(["profile", "--grid", "--out", str(tmp_path)]) == 1
    assert "nothing was measured" in capsys.readouterr().err
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["num_rows"] == 0 and len(summary["errors"]) == 110


def test_a_sticky_cuda_error_stops_the_run(fake_gpu, tmp_path, monkeypatch):
    import torch

    timer = fake_gpu(H200, "fail")

    def dead(*a, **k):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    monkeypatch.setattr(torch.cuda, "synchronize", dead)
    assert main(["profile", "--grid", "--out", str(tmp_path)]) == 1
    assert timer.calls == 1  # not 110 shapes failing one by one
    assert "aborted: CUDA context unusable" in json.loads(
        (tmp_path / "summary.json").read_text())["status"]


# ------------------------------------------------------------------ item 2: the device script
def _device_run(tmp_path: Path, device: str, **env: str) -> tuple[int, str, Path]:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    out = tmp_path / "OUT"
    full = {**os.environ, "OUT": str(out), "PYTHON": sys.executable,
            "PYTHONPATH": str(site), "FAKE_CUDA_DEVICE": device, **env}
    full["PATH"] = "/usr/bin:/bin"  # no nvidia-smi
    p = subprocess.run(["bash", "charon_search/profiling/run_device.sh"], cwd=REPO,
                       env=full, capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout + p.stderr, out


_SITECUSTOMIZE = '''
import os
if os.environ.get("FAKE_CUDA_DEVICE"):
    import time
    import torch
    mode = os.environ.get("FAKE_CUDA_MODE", "ok")
    sleep = float(os.environ.get("FAKE_CUDA_SLEEP", "0"))
    torch.cuda.is_available = lambda: True
    torch.cuda.get_device_name = lambda i=0: os.environ["FAKE_CUDA_DEVICE"]
    torch.cuda.get_device_capability = lambda i=0: (9, 0)
    torch.cuda.device_count = lambda: 1
    torch.cuda.synchronize = lambda *a, **k: None
    torch.version.cuda = "13.0"
    import charon_search.profiling as prof

    class FakeTimer:
        inner, eager_fallbacks, last_note = 10, 0, "timing: fake"

        def __init__(self, **kw):
            pass

        def __call__(self, shape):
            if mode == "fail":
                raise RuntimeError("CUDA error: no kernel image is available")
            if dict(shape.params).get("m", 0) >= 1024:  # only the cross-check's big GEMMs
                time.sleep(sleep)
            return 1e-5
    prof.CudaEventTimer = FakeTimer
'''


def _tar_rows(out: Path, member: str) -> pd.DataFrame:
    with tarfile.open(out / "results.tgz") as tar:
        return pd.read_parquet(io.BytesIO(tar.extractfile(member).read()))


def test_device_run_labels_by_device_and_keeps_a_timed_out_part(tmp_path):
    # decode finishes; the cross-check (30 GEMMs x 0.6 s) outruns its 15 s limit
    rc, log, out = _device_run(tmp_path, H100, PARTS="decode crosscheck",
                               FAKE_CUDA_SLEEP="0.6", PART_LIMIT_S="15")
    assert rc == 1, log  # one part failed (timed out); the other's rows are there
    assert "== GPU key h100-sxm-80gb" in log and "== crosscheck: exit 124" in log
    files = [p for p in out.rglob("*") if p.is_file()]
    assert sorted(p.name for p in files) == ["log.txt", "results.tgz"]  # <= 8 files back
    decode = _tar_rows(out, "./decode/profile_rows.parquet")
    assert set(decode.gpu) == {"h100-sxm-80gb"} and len(decode) > 0
    cross = _tar_rows(out, "./crosscheck/profile_rows.parquet")
    assert 0 < len(cross) < 75  # the rows timed before the kill are kept


def test_device_run_refuses_the_wrong_gpu_and_nothing_measured(tmp_path):
    rc, log, out = _device_run(tmp_path, H100, PARTS="crosscheck",
                               EXPECT_GPU="h200-sxm-141gb")
    assert rc == 2 and "expected h200-sxm-141gb" in log and "== crosscheck" not in log
    assert not (out / "results.tgz").exists()
    rc, log, out = _device_run(tmp_path, H200, PARTS="crosscheck", FAKE_CUDA_MODE="fail")
    assert rc == 3 and "nothing was measured" in log
    rc, log, _ = _device_run(tmp_path, "NVIDIA H100 PCIe", PARTS="crosscheck")
    assert rc == 2 and "refusing" in log
