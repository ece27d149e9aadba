"""One virtual environment per peer, each at a pinned version, all sharing this interpreter's torch.

    python benchmarks/peers/venvs.py [NAME ...]     build (once) and print each peer's Python

The peers pin conflicting versions of their dependencies, so each gets a venv of its own under
$SERVETUNE_VENV_CACHE/peers (default ~/.cache/servetune/venvs/peers), named after its pins and the Python version,
built in a temporary folder and renamed when complete (a half-built venv is never reused).

torch is installed once: ``torch-base-<torch version>`` holds symlinks to the files of torch, torchvision and the
distributions they require (their RECORDs, as installed for this interpreter), and a ``.pth`` in each venv appends
that folder to sys.path, after the venv's own site-packages. pip in the venv sees torch 2.14.1 as installed, and a
constraints file pins ``torch==<this torch>`` and ``torchvision==<this torchvision>`` so that no peer's resolver can
pull another build. Nothing else of servetune's environment is visible in a peer's venv.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

# What each peer's venv installs: the versions measured in docs/peers.md.
PINS: dict[str, list[str]] = {
    "torchserve": ["torchserve==0.12.0", "torch-model-archiver==0.12.0", "pyyaml"],
    "triton": ["nvidia-pytriton==0.7.0"],
    "litserve": ["litserve==0.2.19"],
    "bentoml": ["bentoml==1.4.40", "uvloop"],
    # uvloop 0.22 made asyncio.get_event_loop() raise without a running loop: MLServer 1.7.1's workers then die at
    # start ("There is no current event loop in thread 'MainThread'")
    "mlserver": ["mlserver==1.7.1", "uvloop<0.22"],
    "ray": ["ray[serve]==2.60.0"],
}
# Every venv: the same image stack as servetune's handlers (torchvision needs them; PIL decodes the image).
COMMON = ["pillow", "numpy", "psutil"]
SHARED = ("torch", "torchvision")


def cache_dir() -> Path:
    root = Path(os.environ.get("SERVETUNE_VENV_CACHE", Path.home() / ".cache" / "servetune" / "venvs"))
    return root / "peers"


def _requires(dist: md.Distribution) -> list[str]:
    names = []
    for req in dist.requires or []:
        if ";" in req and "extra ==" in req.split(";", 1)[1]:
            continue  # an extra's requirement: not needed to import the distribution
        match = re.match(r"[A-Za-z0-9_.\-]+", req)
        if match:
            names.append(match.group(0))
    return names


def _closure(roots: tuple[str, ...]) -> list[md.Distribution]:
    """torch, torchvision and every distribution they require, as installed for this interpreter."""
    seen: dict[str, md.Distribution] = {}
    todo = list(roots)
    while todo:
        name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if name in seen:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue  # an optional requirement not installed here (a platform marker's)
        seen[name] = dist
        todo.extend(_requires(dist))
    return list(seen.values())


def torch_base() -> Path:
    """The folder of symlinks to torch's installed files (built once per torch version)."""
    import torch

    target = cache_dir() / f"torch-base-{torch.__version__}-py{sys.version_info.major}.{sys.version_info.minor}"
    if target.exists():
        return target
    cache_dir().mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=".torch-base-", dir=cache_dir()))
    site = Path(sysconfig.get_paths()["purelib"])
    for dist in _closure(SHARED):
        tops: set[str] = set()
        for file in dist.files or []:
            top = file.parts[0]
            if top.startswith("..") or top == "__pycache__":
                continue  # scripts in bin/: a peer calls none of torch's
            tops.add(top)
        for top in tops:
            source = site / top
            if source.exists() and not (building / top).exists():
                (building / top).symlink_to(source)
    os.replace(building, target)
    return target


def venv_python(peer: str) -> Path:
    """Build (once) the peer's venv and return its Python."""
    import torch
    import torchvision

    pins = PINS[peer]
    digest = hashlib.sha256(" ".join([*pins, *COMMON]).encode()).hexdigest()[:8]  # other pins, another venv
    tag = f"{peer}-{pins[0].split('==', 1)[-1]}-py{sys.version_info.major}.{sys.version_info.minor}-{digest}"
    target = cache_dir() / tag
    python = target / "bin" / "python"
    if python.exists():
        _fix_shebangs(target)
        return python
    base = torch_base()
    building = Path(tempfile.mkdtemp(prefix=f".{tag}-", dir=cache_dir()))
    try:
        subprocess.run([sys.executable, "-m", "venv", str(building)], check=True)
        site = next((building / "lib").glob("python*/site-packages"))
        (site / "zz_servetune_torch_base.pth").write_text(f"{base}\n")
        constraints = building / "constraints.txt"
        constraints.write_text(f"torch=={torch.__version__}\ntorchvision=={torchvision.__version__}\n")
        pip = [str(building / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        subprocess.run([*pip, "-c", str(constraints), *pins, *COMMON], check=True)
        os.replace(building, target)  # bin/python finds its site-packages from where it lies: the move is safe
    finally:
        shutil.rmtree(building, ignore_errors=True)
    _fix_shebangs(target)
    return python


def _fix_shebangs(venv: Path) -> None:
    """Point the console scripts (``torchserve``, ``bentoml``, ``mlserver``) at the venv's Python where it now lies:
    pip wrote the temporary folder's path into them."""
    python = f"#!{venv / 'bin' / 'python'}"
    for script in (venv / "bin").iterdir():
        if not script.is_file() or script.is_symlink():
            continue
        with open(script, "rb") as fh:
            first = fh.readline()
        if first.startswith(b"#!") and b"/bin/python" in first and first.strip().decode() != python:
            text = script.read_bytes()
            script.write_bytes(python.encode() + b"\n" + text[len(first) :])


def main() -> int:
    names = sys.argv[1:] or list(PINS)
    unknown = [n for n in names if n not in PINS]
    if unknown:
        print(f"unknown peer(s) {', '.join(unknown)}; of {', '.join(PINS)}", file=sys.stderr)
        return 2
    for name in names:
        print(name, venv_python(name), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
