"""The installable package: ``python -m build`` makes a wheel and an sdist of the tracked files (as a
fresh clone holds them); each installs into a clean venv whose ``gateway --version`` and ``gateway check``
work, with the page's static files. Fast: no build isolation and ``--no-deps`` (the clean venv borrows
the dependencies of the venv running the tests through a .pth line, not the tree under test)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest
import yaml
from support.tier import needs

REPO = Path(__file__).resolve().parent.parent


def run(*argv: str | Path, cwd: Path | None = None) -> str:
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=300, cwd=cwd,
                          check=False)
    assert done.returncode == 0, f"{argv}: {done.stdout[-2000:]}{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
@needs("slow")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel and the sdist, built from a copy of the tracked files."""
    tmp = tmp_path_factory.mktemp("package")
    source = tmp / "source"
    for name in run("git", "ls-files", "-z", cwd=REPO).split("\0"):
        if name and (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    run(sys.executable, "-m", "build", "--no-isolation", "--outdir", tmp / "dist", source)
    return tmp / "dist"


def clean_venv(where: Path) -> Path:
    """A venv without pip or the package, seeing the test venv's dependencies (not its ``gateway``)."""
    run(sys.executable, "-m", "venv", "--without-pip", where)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(where), "platbase": str(where)}))
    (site / "test-deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return where / "bin"


@pytest.mark.parametrize("kind", ["whl", "tar.gz"])
def test_the_wheel_and_the_sdist_install_and_run(dist: Path, kind: str, tmp_path: Path) -> None:
    (artifact,) = dist.glob(f"vsphere_mcp_gateway-*.{kind}")
    bin_dir = clean_venv(tmp_path / "venv")
    run(sys.executable, "-m", "pip", "--python", bin_dir / "python", "install", "-q", "--no-deps",
        "--no-build-isolation", "--no-index", artifact)
    version = run(bin_dir / "gateway", "--version", cwd=tmp_path)
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert version.strip() == f"gateway {declared}", version
    targets = tmp_path / "targets.yaml"
    targets.write_text(yaml.safe_dump({"targets": [{"name": "vc1", "host": "vc1.example.com",
                                                    "credential_env_prefix": "VC1"}]}))
    done = subprocess.run([bin_dir / "gateway", "check", "--home", tmp_path / "home", "--targets", targets],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False,
                          env={"PATH": "/usr/bin:/bin", "VC1_USER": "u", "VC1_PASSWORD": "p"})
    assert done.returncode == 0 and "targets: 1 in" in done.stdout, done.stdout + done.stderr
    where = run(bin_dir / "python", "-c",
                "import gateway, pathlib; print(pathlib.Path(gateway.__file__).parent)", cwd=tmp_path).strip()
    assert where.startswith(str(tmp_path)), where  # the installed copy, not the tree under test
    assert (Path(where) / "web" / "static" / "index.html").is_file()


def test_the_sdist_carries_the_license_recipes_and_examples(dist: Path) -> None:
    (sdist,) = dist.glob("vsphere_mcp_gateway-*.tar.gz")
    names = {name.split("/", 1)[1] for name in run("tar", "tzf", sdist).split() if "/" in name}
    assert {"LICENSE", "targets.example.yaml", "deploy/systemd/vsphere-mcp-gateway.service",
            "deploy/container/Containerfile", "deploy/kubernetes/gateway.yaml"} <= names
    assert "Apache License" in (REPO / "LICENSE").read_text()[:200]
