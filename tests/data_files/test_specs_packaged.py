"""GPU and cluster specs ship inside the package, so a wheel or container image finds them."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import charon_search
from charon_search.hardware.loader import spec_dirs

PKG = Path(charon_search.__file__).resolve().parent


def test_loader_reads_the_package_copy(monkeypatch) -> None:
    monkeypatch.delenv("CHARON_CLUSTER_SPECS", raising=False)
    dirs = spec_dirs()
    assert dirs == [PKG / "cluster_specs"]
    assert (dirs[0] / "gpus" / "h100-sxm-80gb.yaml").is_file()


@pytest.mark.skipif(shutil.which("git") is None, reason="needs the repository checkout")
def test_wheel_carries_every_spec_file(tmp_path) -> None:
    repo = PKG.parent
    if not (repo / "pyproject.toml").is_file():
        pytest.skip("not running from a source checkout")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", str(repo), "-w", str(tmp_path)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("charon_search-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {f"charon_search/cluster_specs/{p.relative_to(PKG / 'cluster_specs').as_posix()}"
               for p in (PKG / "cluster_specs").rglob("*") if p.is_file()}
    assert shipped, "no spec files found in the package"
    assert shipped <= names, sorted(shipped - names)[:5]
