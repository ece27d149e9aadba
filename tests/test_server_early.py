"""Start-up models' parents started before the frontend's own imports (servetune.server.early): which archives get
one and what it imports first, read from real archives; a parent nobody claims is stopped, and one is claimed only
with the environment a parent started later would have. (That a served model's workers fork from the parent started
early: tests/test_server_memory.py.)"""

from __future__ import annotations

import os
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from models import handler_archive, sleep_archive
from servetune.archive import create_archive
from servetune.config.server import ServerConfig
from servetune.server import early

TORCH_HANDLER = "import torch\n\ndef handle(data, context):\n    return [float(torch.ones(1).sum()) for _ in data]\n"
VISION_HANDLER = "from torchvision.models.resnet import ResNet\n\ndef handle(data, context):\n    return data\n"


@pytest.fixture
def store(tmp_path: Path) -> Path:
    store = tmp_path / "store"
    sleep_archive(store, name="noop", batch_ms=0)  # its handler imports no torch
    handler_archive(store, "torchy", "torchy.py", TORCH_HANDLER, {})
    handler_archive(store, "vision", "vision_model.py", VISION_HANDLER, {})
    return store


@pytest.fixture
def no_leftovers() -> Iterator[None]:
    yield
    early.release()


def test_which_archives_get_a_parent_early_and_what_it_imports_first(store: Path, tmp_path: Path) -> None:
    # a no-op's workers start without a parent; the sleep handler imports torch only inside handle(), on a setting
    assert early.early_modules(store / "noop.mar") == ()
    assert early.early_modules(store / "torchy.mar") == ("torch",)
    assert early.early_modules(store / "vision.mar") == ("torch", "torchvision")
    # a built-in handler: torch and the handler's module (it is servetune's, whatever the archive holds)
    (tmp_path / "weights.pt").write_bytes(b"not read here")
    create_archive(
        model_name="classify",
        version="1.0",
        handler="image_classifier",
        serialized_file=str(tmp_path / "weights.pt"),
        export_path=str(store),
        force=True,
    )
    assert early.early_modules(store / "classify.mar") == ("torch", "servetune.handlers.image_classifier")
    # ...and what its model file imports (a built-in handler imports it to build the model)
    model_file = "try:\n    from torchvision.models import resnet\nexcept ImportError:\n    resnet = None\n"
    (tmp_path / "resnet.py").write_text(model_file)
    create_archive(
        model_name="resnet",
        version="1.0",
        handler="image_classifier",
        model_file=str(tmp_path / "resnet.py"),
        serialized_file=str(tmp_path / "weights.pt"),
        export_path=str(store),
        force=True,
    )
    expected = ("torch", "torchvision", "servetune.handlers.image_classifier")
    assert early.early_modules(store / "resnet.mar") == expected
    # an archive with a module of torch's name: its own load decides what "import torch" means
    shadowing = tmp_path / "shadowing.mar"
    with zipfile.ZipFile(store / "torchy.mar") as src, zipfile.ZipFile(shadowing, "w") as dst:
        for item in src.infolist():
            dst.writestr(item, src.read(item.filename))
        dst.writestr("torch.py", "")
    assert early.early_modules(shadowing) == ()
    (tmp_path / "broken.mar").write_bytes(b"not a zip")
    assert early.early_modules(tmp_path / "broken.mar") == ()


def test_an_unclaimed_early_parent_is_stopped_and_a_claim_needs_the_same_environment(
    store: Path, no_leftovers: None
) -> None:
    config = ServerConfig(model_store=store, load_models=("noop.mar", "torchy=torchy.mar"))
    early.start(config, ())
    assert early.claim("noop", early.expected_environment()) is None  # no parent for a model without torch
    started = early._waiting["torchy"]
    proc = psutil.Process(started.proc.pid)
    assert proc.ppid() == os.getpid()
    # its early imports (a process reads an empty command line while it is still in exec: read it once it has one)
    deadline = time.monotonic() + 10
    while not proc.cmdline() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "servetune.server.forkserver" in proc.cmdline() and proc.cmdline()[-1] == "torch"
    # another environment than the model's parent would get: not claimed, and stopped
    assert early.claim("torchy", {**early.expected_environment(), "OMP_NUM_THREADS": "2"}) is None
    assert started.proc.returncode is not None and not proc.is_running()

    early.start(config, ("torchy=torchy.mar",))  # --models wins over load_models, as at start-up
    again = early._waiting["torchy"]
    assert list(early._waiting) == ["torchy"]
    early.release()  # the start-up models have loaded and none claimed it
    assert again.proc.returncode is not None and early._waiting == {}
    early.start(config, ())
    claimed = early.claim("torchy", early.expected_environment())
    assert claimed is not None and claimed.proc.poll() is None and claimed.modules == ("torch",)
    claimed.sock.close()
    claimed.proc.kill()  # not to wait for its import of torch (a ModelParent's stop closes the socket: it exits then)
    claimed.proc.wait()


def test_no_parent_starts_early_where_the_configuration_turns_parents_off(store: Path, no_leftovers: None) -> None:
    early.start(ServerConfig(model_store=store, load_models=("torchy.mar",), worker_preload="off"), ())
    models = {"torchy": {"1.0": {"marName": "torchy.mar", "workerPreload": "off"}}}
    early.start(ServerConfig(model_store=store, load_models=("torchy.mar",), models=models), ())
    early.start(ServerConfig(model_store=store, load_models=("all",)), ())  # all, as a snapshot: left to the API
    assert early._waiting == {}
