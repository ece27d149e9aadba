"""PyTorch 2's deployment format end to end: ``servetune optimize --write`` exports (``export``) and compiles
(``aoti``) real archives into ``.pt2`` archives, one server serves them (a tiny CNN, torchvision's resnet18 and the
Animated Drawings pose estimator) at batch 1, 3 and 8 with eager's answers, a ``.pt2`` built for another device or
torch or a corrupt one fails its load alone, the compiled package is reused from the variant cache by a later start,
and the KServe runtime serves a ``.pt2`` archive.

One AOTInductor compile for the whole file (the tiny CNN, by ``servetune optimize``); every later load of it,
served or in-process, finds it in this file's variant cache.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
import yaml
from click.testing import CliRunner

from conftest import RunningServer
from http_client import Reply, burst, call
from servetune._exceptions import ArchiveError, ConfigError
from servetune.archive import create_archive, open_archive
from servetune.archive.pt2 import Pt2Info, inspect_pt2
from servetune.cli import cli
from servetune.handlers import InputParam, Request, load_service, uninstall_ts_alias
from servetune.optimize import (
    VariantNotApplicable,
    apply_variant,
    load_pt2,
    sample_inputs,
    variant_tolerance,
)
from servetune.optimize.cache import CACHE_ENV
from servetune.optimize.measure import measure_variants
from servetune.optimize.pt2 import incompatibility
from servetune.ready import ReadyInfo

ROOT = Path(__file__).resolve().parents[1]
AD_EXAMPLE = ROOT / "examples" / "animated_drawings"
RESNET_EXAMPLE = ROOT / "examples" / "resnet18"
POSE = "drawn_humanoid_pose_estimator"
CPU = torch.device("cpu")

TINY = textwrap.dedent(
    """
    import torch
    from torch import nn


    class TinyCNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.bn = nn.BatchNorm2d(8)
            self.head = nn.Linear(8, 10)

        def forward(self, x):
            return self.head(torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3)))
    """
)
TINY_CONFIG = {"input_shape": [3, 16, 16], "batchSize": 8, "maxBatchDelay": 50}


def tiny_model() -> torch.nn.Module:
    namespace: dict[str, Any] = {}
    exec(compile(TINY, "tiny_model", "exec"), namespace)
    torch.manual_seed(0)
    model: torch.nn.Module = namespace["TinyCNN"]()
    return model.eval()


def tiny_archive(src: Path, out: Path, name: str, config: dict[str, Any]) -> Path:
    src.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    (src / "tiny_model.py").write_text(TINY)
    torch.save(tiny_model().state_dict(), src / "weights.pt")
    (src / "model-config.yaml").write_text(yaml.safe_dump(config))
    return create_archive(model_name=name, version="1.0", handler="base_handler", model_file=src / "tiny_model.py",
                          serialized_file=src / "weights.pt", config_file=src / "model-config.yaml",
                          export_path=out, force=True)  # fmt: skip


def optimize(archive: Path, *args: str) -> list[dict[str, Any]]:
    """``servetune optimize ARCHIVE ... --write --json``: the rows, after checking it ran."""
    out = archive.parent / f"{archive.name}.json"
    cmd = ["optimize", str(archive), *args, "--repeat", "1", "--warmup", "0", "--write", "--json", str(out)]
    result = CliRunner().invoke(cli, cmd, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    rows: list[dict[str, Any]] = json.loads(out.read_text())
    return rows


@pytest.fixture(scope="module")
def variant_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """This file's variant cache, for the optimize runs here and every server started here (they inherit it)."""
    path = tmp_path_factory.mktemp("variant-cache")
    before = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(path)
    yield path
    if before is None:
        os.environ.pop(CACHE_ENV, None)
    else:
        os.environ[CACHE_ENV] = before


@pytest.fixture(scope="module")
def ad_example() -> Iterator[ModuleType]:
    sys.path.insert(0, str(AD_EXAMPLE))
    try:
        yield importlib.import_module("make_archives")
    finally:
        sys.path.remove(str(AD_EXAMPLE))
        for name in ("make_archives", "pose_handler", "pose_model", "detector_model", "ad_common"):
            sys.modules.pop(name, None)
        uninstall_ts_alias()


@dataclasses.dataclass
class Built:
    archives: Path  # the eager archives (and <name>.optimized/ beside tiny's)
    store: Path  # what the server serves
    tiny_rows: dict[str, dict[str, Any]]  # servetune optimize's rows for the tiny CNN, by variant


def exported(model: torch.nn.Module, shape: tuple[int, ...], path: Path) -> Path:
    """What a user of torch.export does: the model with a dynamic batch (1..8), saved."""
    batch = torch.export.Dim("batch", min=1, max=8)
    with torch.no_grad():
        program = torch.export.export(model.eval(), (torch.rand(2, *shape),), dynamic_shapes=({0: batch},))
    torch.export.save(program, str(path))
    return path


@pytest.fixture(scope="module")
def built(variant_cache: Path, ad_example: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Built:
    """The tiny CNN through ``servetune optimize --write`` (export and aoti: the file's one compile), and
    resnet18 and the pose estimator exported by torch.export and archived with ``servetune archive`` as .pt2
    archives (no model file), each beside its eager archive (the reference)."""
    work = tmp_path_factory.mktemp("pt2")
    archives, store = work / "archives", work / "store"
    store.mkdir()
    tiny = tiny_archive(work / "src-tiny", archives, "tiny", TINY_CONFIG)
    rows = {row["variant"]: row for row in optimize(tiny, "--variants", "export,aoti", "--batch-sizes", "1,8")}
    shutil.copy(archives / "tiny.optimized" / "tiny-aoti.mar", store)
    # the same model with the variant built at load: the worker finds optimize's package in the shared cache
    shutil.copy(tiny_archive(work / "src-live", archives, "tiny-live", {**TINY_CONFIG, "optimization": "aoti"}),
                store)  # fmt: skip

    sys.path.insert(0, str(RESNET_EXAMPLE))
    try:
        resnet = importlib.import_module("make_archive").build(archives)
        model = importlib.import_module("model").ResNet18()
    finally:
        sys.path.remove(str(RESNET_EXAMPLE))
        sys.modules.pop("make_archive", None)
        sys.modules.pop("model", None)
    eager = open_archive(resnet, work / "resnet18-eager")
    model.load_state_dict(torch.load(eager.model_dir / "resnet18.pt", weights_only=True))
    create_archive(model_name="resnet18", version="1.0", handler="image_classifier", export_path=store,
                   serialized_file=exported(model, (3, 224, 224), work / "resnet18.pt2"),
                   extra_files=[str(eager.model_dir / "index_to_name.json")])  # fmt: skip

    pose_dir = ad_example.build_archive("pose", archives, overrides={"batchSize": 8, "maxBatchDelay": 50},
                                        archive_format="no-archive", quiet=True)  # fmt: skip
    model = importlib.import_module("pose_model").DrawnHumanoidPoseEstimator()
    model.load_state_dict(torch.load(pose_dir / f"{POSE}.pt", weights_only=True))
    extras = [str(pose_dir / name) for name in ("pose_model.py", "ad_common.py", "weights_info.json",
                                                 "index_to_name.json")]  # fmt: skip
    create_archive(model_name=POSE, version="1.0", handler=str(pose_dir / "pose_handler.py"), export_path=store,
                   serialized_file=exported(model, (3, 256, 192), work / f"{POSE}.pt2"), extra_files=extras,
                   config_file=pose_dir / "model-config.yaml")  # fmt: skip
    return Built(archives, store, rows)


SERVED = {
    "tiny-aoti": "tiny-aoti.mar",
    "tiny-live": "tiny-live.mar",
    "resnet18": "resnet18.mar",
    "pose": f"{POSE}.mar",
}


@pytest.fixture(scope="module")
def server(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    properties = {"disable_token_authorization": "true", "default_workers_per_model": "1", "enable_model_api": "true"}
    running = RunningServer(built.store, SERVED, properties, workdir=tmp_path_factory.mktemp("server"),
                            startup_timeout=300)  # fmt: skip
    running.start()
    yield running
    running.stop()


# -- references ----------------------------------------------------------------------------------------------


def tiny_inputs(count: int, seed: int) -> list[list[Any]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.rand((3, 16, 16), generator=generator).tolist() for _ in range(count)]


def images(count: int, seed: int) -> list[bytes]:
    from PIL import Image, ImageDraw

    out = []
    for n in range(count):
        image = Image.new("RGB", (120 + 20 * n, 160), (30 * n % 256, 90, 160))
        ImageDraw.Draw(image).ellipse((10 + n, 20, 90, 140 - n), fill=((seed * 40 + n * 25) % 256, 200, 40))
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        out.append(buffer.getvalue())
    return out


def eager_service(archive: Path, workdir: Path, batch_size: int) -> Any:
    opened = open_archive(archive, workdir)
    return load_service(model_dir=opened.model_dir, manifest=opened.manifest.raw, model_name=archive.stem,
                        gpu_id=None, batch_size=batch_size, model_yaml_config=opened.model_config)  # fmt: skip


def eager_answers(service: Any, bodies: list[bytes], content_type: str) -> list[Any]:
    requests = [Request(f"r{n}", {}, [InputParam("data", content_type, body)]) for n, body in enumerate(bodies)]
    responses = service.predict(requests)
    assert [r.status for r in responses] == [200] * len(bodies), [r.body[:200] for r in responses]
    return [json.loads(r.body) for r in responses]


def numbers(obj: Any) -> list[float]:
    if isinstance(obj, dict):
        return [n for value in obj.values() for n in numbers(value)]
    if isinstance(obj, list):
        return [n for value in obj for n in numbers(value)]
    return [float(obj)] if isinstance(obj, (int, float)) and not isinstance(obj, bool) else []


def assert_close(served: Any, reference: Any, atol: float, rtol: float) -> None:
    """The parity rule on one answer: same structure, keys and labels; every number within
    ``atol + rtol * max|reference|`` of eager's."""
    scale = max((abs(n) for n in numbers(reference)), default=0.0)

    def walk(a: Any, b: Any, where: str) -> None:
        if isinstance(b, dict):
            assert isinstance(a, dict) and list(a) == list(b), f"{where}: {a!r} vs eager {b!r}"
            for key in b:
                walk(a[key], b[key], f"{where}.{key}")
        elif isinstance(b, list):
            assert isinstance(a, list) and len(a) == len(b), f"{where}: {a!r} vs eager {b!r}"
            for n, (x, y) in enumerate(zip(a, b, strict=True)):
                walk(x, y, f"{where}[{n}]")
        elif isinstance(b, float):
            assert abs(a - b) <= atol + rtol * scale, f"{where}: {a} vs eager {b} (atol {atol}, rtol {rtol})"
        else:
            assert a == b, f"{where}: {a!r} vs eager {b!r}"

    walk(served, reference, "answer")


def served_batch(server: RunningServer, model: str, bodies: list[bytes], content_type: str) -> list[Reply]:
    """Set ``model``'s batch size to ``len(bodies)`` (in place) and send them at once: one batch of that size. The
    model's batching is put back after (a lone request would wait out the 30 s delay)."""
    size = len(bodies)
    [before] = call("GET", f"{server.management_url}/models/{model}").json()
    changed = call("PUT", f"{server.management_url}/models/{model}?batch_size={size}&max_batch_delay=30000")
    assert changed.status == 200, changed.body
    try:
        replies = burst("POST", f"{server.inference_url}/predictions/{model}", bodies, {"Content-Type": content_type})
    finally:
        back = f"batch_size={before['batchSize']}&max_batch_delay={before['maxBatchDelay']}"
        assert call("PUT", f"{server.management_url}/models/{model}?{back}").status == 200
    assert [r.status for r in replies] == [200] * size, [r.body[:300] for r in replies]
    assert {int(r.headers["x-servetune-batch-size"]) for r in replies} == {size}
    return replies


# -- servetune optimize --------------------------------------------------------------------------------------


def test_optimize_exports_and_compiles_with_time_size_and_a_dynamic_batch(built: Built, variant_cache: Path) -> None:
    rows = built.tiny_rows
    assert list(rows) == ["eager", "export", "aoti"]
    for name in ("export", "aoti"):
        row = rows[name]
        assert row["status"] == "ok", row
        assert row["convert_s"] > 0 and row["artifact_mib"] > 0
        assert row["parity"]["failures"] == [] and row["parity"]["top1_agreement"] == 1.0
        assert "dynamic batch 1..8" in row["notes"]
        copy = Path(row["artifact"])  # --write: the results point at the copy beside the archive
        assert copy.parent == built.archives / "tiny.optimized" and copy.suffix == ".pt2"
        assert (variant_cache / copy.name).read_bytes() == copy.read_bytes()
        assert set(row["latency_ms"]) == {"1", "8"}
    assert "compiled" in rows["aoti"]["notes"]
    written = built.archives / "tiny.optimized" / "tiny-aoti.mar"
    with zipfile.ZipFile(written) as archive:
        manifest = json.loads(archive.read("MAR-INF/MANIFEST.json"))
        config = yaml.safe_load(archive.read("model-config.yaml"))
        names = set(archive.namelist())
    model = manifest["model"]
    assert model["serializedFile"] == "tiny.pt2" and "modelFile" not in model and model["handler"] == "base_handler"
    assert model["pt2"]["format"] == "aoti" and model["pt2"]["device"] == "cpu"
    assert model["pt2"]["torchVersion"] == torch.__version__
    assert model["pt2"]["dynamic"] == [{"input": 0, "dim": 0, "min": 1, "max": 8}]
    assert "optimization" not in config and config["batchSize"] == 8  # nothing converts at load
    assert "weights.pt" not in names and "tiny_model.py" in names  # the eager weights stay behind


def test_a_second_optimize_finds_the_package_in_the_cache(built: Built) -> None:
    tiny = built.archives / "tiny.mar"
    [_, again] = optimize(tiny, "--variants", "aoti", "--batch-sizes", "1,8")
    assert again["status"] == "ok" and any(note.startswith("loaded from cache") for note in again["notes"])
    assert again["artifact"] == built.tiny_rows["aoti"]["artifact"]
    assert again["convert_s"] < built.tiny_rows["aoti"]["convert_s"] / 3  # no compile: load and the first call


@pytest.mark.filterwarnings("ignore:`torch.jit:FutureWarning")  # TorchScript is what is being migrated away from
def test_a_torchscript_archive_migrates_to_pt2(built: Built, tmp_path: Path) -> None:
    """A TorchScript archive (no model file) exports through torch's TorchScript converter; its .pt2 archive
    answers as the TorchScript model did."""
    model = tiny_model()
    example = torch.rand(2, 3, 16, 16)
    traced = torch.jit.trace(model, (example,))  # type: ignore[no-untyped-call]
    torch.jit.save(traced, tmp_path / "tiny.pt")  # type: ignore[no-untyped-call]
    (tmp_path / "model-config.yaml").write_text(yaml.safe_dump({"input_shape": [3, 16, 16], "batchSize": 4}))
    archive = create_archive(
        model_name="tiny-ts",
        version="1.0",
        handler="base_handler",
        export_path=tmp_path,
        serialized_file=tmp_path / "tiny.pt",
        config_file=tmp_path / "model-config.yaml",
    )
    [_, row] = optimize(archive, "--variants", "export", "--batch-sizes", "1,4")
    assert row["status"] == "ok" and "converted from TorchScript" in row["notes"], row
    with zipfile.ZipFile(tmp_path / "tiny-ts.optimized" / "tiny-ts-export.mar") as written:
        (tmp_path / "out.pt2").write_bytes(written.read("tiny-ts.pt2"))
    loaded = load_pt2(tmp_path / "out.pt2", CPU)
    for batch in (1, 3):
        x = torch.rand(batch, 3, 16, 16)
        with torch.no_grad():
            torch.testing.assert_close(loaded(x), traced(x), atol=1e-5, rtol=1e-4)


def test_the_mask_rcnn_detector_is_refused_at_optimize_time_with_the_reason() -> None:
    import torchvision

    detector = torchvision.models.detection.maskrcnn_resnet50_fpn(weights=None, weights_backbone=None).eval()
    results = measure_variants(["export", "aoti"], detector, device=CPU, batch_sizes=(1,),
                               make_inputs=lambda batch: sample_inputs(detector, (3, 64, 64), batch))  # fmt: skip
    assert [(r.variant, r.status) for r in results] == [("export", "n/a"), ("aoti", "n/a")]
    for result in results:
        assert result.reason is not None and "list of images" in result.reason and "dynamic" in result.reason


# -- serving ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["tiny-aoti", "tiny-live"])
def test_the_tiny_compiled_serves_batches_of_1_3_8_as_eager(server: RunningServer, model: str) -> None:
    reference = tiny_model()
    tol = variant_tolerance("aoti")
    for size in (1, 3, 8):
        inputs = tiny_inputs(size, seed=size)
        replies = served_batch(server, model, [json.dumps(x).encode() for x in inputs], "application/json")
        with torch.no_grad():
            expected = reference(torch.tensor(inputs)).tolist()
        for reply, row in zip(replies, expected, strict=True):
            assert_close(reply.json(), row, tol.atol, tol.rtol)


def test_resnet18_exported_serves_batches_of_1_3_8_as_eager(
    server: RunningServer, built: Built, tmp_path: Path
) -> None:
    eager = eager_service(built.archives / "resnet18.mar", tmp_path / "eager", 8)
    tol = variant_tolerance("export")
    for size in (1, 3, 8):
        bodies = images(size, seed=size)
        replies = served_batch(server, "resnet18", bodies, "image/png")
        for reply, expected in zip(replies, eager_answers(eager, bodies, "image/png"), strict=True):
            assert_close(reply.json(), expected, tol.atol, tol.rtol)  # top-5 labels in order, probabilities


def test_the_pose_estimator_exported_serves_batches_of_1_3_8_as_eager(
    server: RunningServer, built: Built, ad_example: ModuleType, tmp_path: Path
) -> None:
    eager = eager_service(built.archives / POSE, tmp_path / "eager", 8)
    tol = variant_tolerance("export")
    for size in (1, 3, 8):
        bodies = images(size, seed=10 + size)
        replies = served_batch(server, "pose", bodies, "image/png")
        for reply, expected in zip(replies, eager_answers(eager, bodies, "image/png"), strict=True):
            [answer], [eager_answer] = reply.json(), expected
            served, reference = answer["keypoints"], eager_answer["keypoints"]
            assert len(served) == len(reference) == 17
            # positions (crop pixels) and scores (heatmap peaks), each checked on its own scale
            assert_close([k[:2] for k in served], [k[:2] for k in reference], tol.atol, tol.rtol)
            assert_close([k[2] for k in served], [k[2] for k in reference], tol.atol, tol.rtol)


def test_describe_says_what_was_loaded(server: RunningServer, built: Built) -> None:
    def customized(model: str) -> Any:
        reply = call("GET", f"{server.management_url}/models/{model}?customized=true")
        assert reply.status == 200, reply.body
        return reply.json()[0]["customizedMetadata"]

    aoti = customized("tiny-aoti")["pt2"]
    assert aoti == {"file": "tiny.pt2", "format": "aoti", "torchVersion": torch.__version__, "device": "cpu",
                    "dynamic": [{"input": 0, "dim": 0, "min": 1, "max": 8}], "cpuIsa": aoti["cpuIsa"]}  # fmt: skip
    program = customized("resnet18")["pt2"]
    assert program == {"file": "resnet18.pt2", "format": "exported-program", "torchVersion": torch.__version__,
                       "device": "cpu", "dynamic": [{"input": 0, "dim": 0, "min": 1, "max": 8}]}  # fmt: skip
    live = customized("tiny-live")
    assert live["optimization"] == "aoti" and live["pt2"]["format"] == "aoti" and "max_abs=" in live["parity"]
    assert f"loaded from cache {Path(built.tiny_rows['aoti']['artifact']).name}" in live["notes"]
    pose = customized("pose")
    assert pose["loaded"]["pt2"]["format"] == "exported-program" and pose["weights"]["source"] == "random"


def test_the_cache_is_reused_on_a_second_start(built: Built, start_server: Any) -> None:
    compiled_s = built.tiny_rows["aoti"]["convert_s"]
    again = start_server(model_store=built.store, models={"tiny-live": "tiny-live.mar"})
    reply = call("GET", f"{again.management_url}/models/tiny-live?customized=true")
    live = reply.json()[0]["customizedMetadata"]
    assert any(note.startswith("loaded from cache") for note in live["notes"]) and "compiled" not in live["notes"]
    assert live["convertSeconds"] < compiled_s / 3, (live["convertSeconds"], compiled_s)
    answer = call("POST", f"{again.inference_url}/predictions/tiny-live", json.dumps(tiny_inputs(1, 0)[0]).encode(),
                  {"Content-Type": "application/json"})  # fmt: skip
    assert answer.status == 200 and len(answer.json()) == 10


def rewritten(source: Path, dest: Path, change: Any) -> Path:
    """A copy of the .pt2 archive ``source`` whose .pt2 member is ``change(bytes)``."""
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(dest, "w") as new:
        for item in old.infolist():
            data = old.read(item)
            new.writestr(item, change(data) if item.filename.endswith(".pt2") else data)
    return dest


def with_metadata(**values: str) -> Any:
    def change(package: bytes) -> bytes:
        out = io.BytesIO()
        with zipfile.ZipFile(io.BytesIO(package)) as old, zipfile.ZipFile(out, "w") as new:
            for item in old.infolist():
                data = old.read(item)
                if item.filename.endswith("_metadata.json"):
                    data = json.dumps({**json.loads(data), **values}).encode()
                new.writestr(item, data)
        return out.getvalue()

    return change


MISMATCHES = [
    ("for-cuda", with_metadata(AOTI_DEVICE_KEY="cuda"), "compiled for cuda and this worker's device is cpu"),
    ("old-torch", with_metadata(**{"servetune.torch_version": "2.13.0"}), "built with torch 2.13.0"),
    ("corrupt", lambda data: data[: len(data) // 3], "is not a readable .pt2 archive"),
]


def test_a_pt2_for_another_device_or_torch_or_corrupt_is_refused_before_loading(built: Built, tmp_path: Path) -> None:
    package = Path(built.tiny_rows["aoti"]["artifact"]).read_bytes()
    for name, change, message in MISMATCHES:
        (tmp_path / f"{name}.pt2").write_bytes(change(package))
        with pytest.raises(ArchiveError, match=message):
            load_pt2(tmp_path / f"{name}.pt2", CPU)


@pytest.mark.parametrize(("name", "change", "message"), [MISMATCHES[0], MISMATCHES[2]], ids=["for-cuda", "corrupt"])
def test_a_pt2_for_another_device_or_a_corrupt_one_fails_its_load_alone(
    server: RunningServer, built: Built, name: str, change: Any, message: str
) -> None:
    rewritten(built.store / "tiny-aoti.mar", built.store / f"{name}.mar", change)
    url = f"{server.management_url}/models?url={name}.mar&model_name={name}&initial_workers=1&synchronous=true"
    reply = call("POST", url, timeout=120)
    assert reply.status == 500, reply.body
    assert message in reply.json()["message"], reply.json()
    assert call("GET", f"{server.management_url}/models/{name}").status == 404  # removed, not left broken
    still = call("POST", f"{server.inference_url}/predictions/tiny-aoti", json.dumps(tiny_inputs(1, 5)[0]).encode(),
                 {"Content-Type": "application/json"})  # fmt: skip
    assert still.status == 200 and len(still.json()) == 10


# -- in-process ------------------------------------------------------------------------------------------------


def test_a_batch_outside_the_bounds_is_refused_with_them(built: Built) -> None:
    loaded = load_pt2(built.tiny_rows["aoti"]["artifact"], CPU)
    assert loaded(torch.rand(8, 3, 16, 16)).shape == (8, 10)
    with pytest.raises(ValueError, match=r"a batch of 9 .* outside \[1, 8\].*export_max_batch"):
        loaded(torch.rand(9, 3, 16, 16))


def test_a_pt2_archive_refuses_a_model_file_and_a_corrupt_pt2(tmp_path: Path, built: Built) -> None:
    package = Path(built.tiny_rows["export"]["artifact"])
    (tmp_path / "model.py").write_text(TINY)
    with pytest.raises(ArchiveError, match="takes no model_file"):
        create_archive(model_name="x", version="1", handler="base_handler", export_path=tmp_path,
                       serialized_file=package, model_file=tmp_path / "model.py")  # fmt: skip
    (tmp_path / "bad.pt2").write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(ArchiveError, match="bad.pt2 is not a readable .pt2 archive"):
        create_archive(model_name="x", version="1", handler="base_handler", export_path=tmp_path,
                       serialized_file=tmp_path / "bad.pt2")  # fmt: skip
    (tmp_path / "other.pt2").write_bytes(_zip({"x/data.txt": b"hello"}))
    with pytest.raises(ArchiveError, match="neither a saved ExportedProgram"):
        inspect_pt2(tmp_path / "other.pt2")


def _zip(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return out.getvalue()


def test_incompatibility_names_what_differs() -> None:
    release = torch.__version__.split("+")[0]
    aoti = Pt2Info("aoti", f"{release}+other", "cpu", cpu_isa="NO_SUCH_ISA")
    assert incompatibility(dataclasses.replace(aoti, cpu_isa=None), CPU) is None  # another build of this release
    assert "CPU vector ISA NO_SUCH_ISA" in (incompatibility(aoti, CPU) or "")
    assert "compiled for cuda" in (incompatibility(dataclasses.replace(aoti, device="cuda"), CPU) or "")
    older = incompatibility(dataclasses.replace(aoti, torch_version="2.0.1"), CPU) or ""
    assert "built with torch 2.0.1" in older and torch.__version__ in older
    program = Pt2Info("exported-program", torch.__version__, "cuda")
    assert "exported on cuda" in (incompatibility(program, CPU) or "")
    assert incompatibility(dataclasses.replace(program, device="cpu"), CPU) is None
    unrecorded = Pt2Info("aoti", None, "cpu")  # built outside servetune: nothing to hold against it
    assert incompatibility(unrecorded, CPU) is None


def test_the_tuner_bounds_an_exported_family_by_its_largest_batch(tmp_path: Path) -> None:
    from servetune.tune.archives import trial_model_config
    from servetune.tune.study import Family, Load

    family = Family("aoti/cpu", tmp_path / "m.mar", "channels_last+aoti", "cpu", (1,), (1, 4, 16), (10,), Load())
    assert trial_model_config({"batchSize": 2}, family)["export_max_batch"] == 16
    assert trial_model_config({}, family)["startupTimeout"] >= 600  # the first load compiles
    assert trial_model_config({"startupTimeout": 200}, family)["startupTimeout"] == 200
    assert trial_model_config({"export_max_batch": 32}, family)["export_max_batch"] == 32
    eager = dataclasses.replace(family, optimization="eager")
    assert "export_max_batch" not in trial_model_config({}, eager) and "startupTimeout" not in trial_model_config(
        {}, eager
    )


def test_an_exported_variant_of_a_chain_takes_float32_inputs(tmp_path: Path) -> None:
    """channels_last+bf16+export: the layout and the cast are inside the program, so the .pt2 takes what the model
    takes (float32, contiguous) and gives float32."""
    model = tiny_model()
    variant = apply_variant("channels_last+bf16+export", model, device=CPU, example_inputs=(torch.rand(2, 3, 16, 16),),
                            cache_dir=tmp_path, max_batch=4)  # fmt: skip
    assert variant.parity is not None and variant.parity.passed
    assert variant.input_dtype is None and variant.memory_format is None
    package = load_pt2(variant.artifact or "", CPU)
    out = package(torch.rand(3, 3, 16, 16))
    assert out.dtype == torch.float32 and out.shape == (3, 10)
    with pytest.raises(VariantNotApplicable, match="needs example inputs"):
        apply_variant("export", model, device=CPU, example_inputs=None, check=False)
    with pytest.raises(ConfigError, match="export and int8-dynamic do not combine: dynamically quantized"):
        apply_variant("int8-dynamic+export", model, device=CPU, example_inputs=(torch.rand(2, 3, 16, 16),))


# -- KServe ----------------------------------------------------------------------------------------------------


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}  # fmt: skip


def test_the_kserve_runtime_serves_a_pt2_archive(built: Built, tmp_path: Path) -> None:
    layout = tmp_path / "models"
    (layout / "model-store").mkdir(parents=True)
    shutil.copy(built.store / "tiny-aoti.mar", layout / "model-store" / "tiny.mar")
    before = tree_digest(layout)
    ready = tmp_path / "ready.json"
    cmd = [sys.executable, "-m", "servetune", "kserve", "--model-dir", str(layout), "--ready-file", str(ready)]
    for port in ("--http-port", "--grpc-port", "--management-port", "--grpc-management-port", "--metrics-port"):
        cmd += [port, "0"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env={**os.environ, "PROTOCOL_VERSION": "v2"}, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ready.exists(), proc.stdout.read() if proc.poll() is not None and proc.stdout else "no ready file"
        info = ReadyInfo.read(ready)
        assert info.failed == {} and info.models == {"tiny": ["1.0"]}
        url = info.urls["inference"]
        assert call("GET", f"{url}/v2/health/ready").status == 200
        [x] = tiny_inputs(1, seed=42)
        with torch.no_grad():
            expected = tiny_model()(torch.tensor([x]))[0].tolist()
        tol = variant_tolerance("aoti")
        body = {"inputs": [{"name": "input-0", "shape": [3, 16, 16], "datatype": "FP32",
                            "data": torch.tensor(x).flatten().tolist()}]}  # fmt: skip
        headers = {"Content-Type": "application/json"}
        v2 = call("POST", f"{url}/v2/models/tiny/infer", json.dumps(body).encode(), headers)
        assert v2.status == 200, v2.body
        assert_close(v2.json()["outputs"][0]["data"], expected, tol.atol, tol.rtol)
        v1 = call("POST", f"{url}/v1/models/tiny:predict", json.dumps({"instances": [x]}).encode(),
                  {"Content-Type": "application/json"})  # fmt: skip
        assert v1.status == 200, v1.body
        assert_close(v1.json()["predictions"][0], expected, tol.atol, tol.rtol)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert tree_digest(layout) == before, "the model directory must never be written to"


# -- GPU ---------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_aoti_on_cuda_matches_eager_and_is_refused_on_cpu(tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    cuda = torch.device("cuda:0")
    model = tiny_model().to(cuda)
    variant = apply_variant("aoti", model, device=cuda, example_inputs=(torch.rand(2, 3, 16, 16, device=cuda),),
                            cache_dir=tmp_path, max_batch=8)  # fmt: skip
    assert variant.parity is not None and variant.parity.passed
    info = inspect_pt2(variant.artifact or "")
    assert info.device == "cuda" and info.compute_capability and info.cuda_version == torch.version.cuda
    with torch.no_grad():
        x = torch.rand(5, 3, 16, 16, device=cuda)
        torch.testing.assert_close(variant(x), model(x), atol=1e-4, rtol=1e-3)
    with pytest.raises(ArchiveError, match="compiled for cuda and this worker's device is cpu"):
        load_pt2(variant.artifact or "", CPU)


@pytest.mark.gpu
def test_a_program_exported_on_cpu_serves_on_cuda(tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    model = tiny_model()
    variant = apply_variant("export", model, device=CPU, example_inputs=(torch.rand(2, 3, 16, 16),),
                            cache_dir=tmp_path, max_batch=8)  # fmt: skip
    on_gpu = load_pt2(variant.artifact or "", torch.device("cuda:0"))
    x = torch.rand(3, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(on_gpu(x.cuda()).cpu(), model(x), atol=1e-4, rtol=1e-3)
