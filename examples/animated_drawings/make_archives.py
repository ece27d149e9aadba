"""Build the two Animated Drawings archives with ``servetune archive``: drawn_humanoid_detector.mar and
drawn_humanoid_pose_estimator.mar.

The trained weights are not public, so the archives carry random weights made here with a fixed seed
(``torch.manual_seed(seed)`` then the model's constructor) and packed as the serialized state_dict: every worker
loads the same tensors, and ``weights_info.json`` in the archive (shown by the handlers' ``describe``) says what
they are. The answers are meaningless; the cost is the real architectures'. To serve trained weights, set
``weights:`` in detector.yaml / pose.yaml (a state_dict file) and rebuild.

    python examples/animated_drawings/make_archives.py --out model_store
    python examples/animated_drawings/make_archives.py --out model_store --detector-size 256 \\
        --set detector:batchSize=4 --set detector:detector.rpn_post_nms_top_n=300

``--set MODEL:KEY=VALUE`` changes one model-config.yaml key (dotted for a section key; the value is YAML).
``--fp16`` also builds drawn_humanoid_detector_fp16.mar (``optimization: fp16``, CUDA only), the second archive that
TorchServe's auto-benchmark form of the case study (case_study_torchserve.yaml) needs, since that form names one
archive per mode.
"""

from __future__ import annotations

import argparse
import importlib
import json
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class ModelSpec:
    name: str  # the model name the Animated Drawings app calls
    model_file: str
    model_class: str
    handler: str
    config: str


MODELS: dict[str, ModelSpec] = {
    "detector": ModelSpec(
        "drawn_humanoid_detector", "detector_model.py", "DrawnHumanoidDetector", "detector_handler.py", "detector.yaml"
    ),
    "pose": ModelSpec(
        "drawn_humanoid_pose_estimator", "pose_model.py", "DrawnHumanoidPoseEstimator", "pose_handler.py", "pose.yaml"
    ),
}


def model_config(spec: ModelSpec, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The model's YAML with ``overrides`` (``{"batchSize": 4, "detector.min_size": 256}``) applied."""
    config: dict[str, Any] = yaml.safe_load((HERE / spec.config).read_text())
    for dotted, value in overrides.items():
        *parents, key = dotted.split(".")
        node = config
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"{spec.config}: cannot set {dotted!r}: {part!r} is not a section")
        node[key] = value
    return config


def model_module(spec: ModelSpec) -> Any:
    """The example's model file of ``spec``, imported."""
    sys.path.insert(0, str(HERE))
    try:
        return importlib.import_module(Path(spec.model_file).stem)
    finally:
        sys.path.remove(str(HERE))


def random_weights(spec: ModelSpec, seed: int, path: Path) -> dict[str, Any]:
    """Save the seeded random state_dict of ``spec``'s model to ``path``; return its provenance record."""
    torch.manual_seed(seed)
    model = getattr(model_module(spec), spec.model_class)()
    torch.save(model.state_dict(), path)
    return {
        "source": "random",
        "seed": seed,
        "made_by": f"torch.manual_seed({seed}); {spec.model_class}() in make_archives.py",
        "torch": torch.__version__,
        "note": "RANDOM weights: the answers are meaningless, the cost is real. "
        "Set weights: in model-config.yaml to serve a trained state_dict.",
    }


def build_archive(
    which: str,
    out: Path,
    *,
    seed: int = 0,
    overrides: Mapping[str, Any] | None = None,
    archive_format: str = "default",
    quiet: bool = False,
    name_suffix: str = "",
) -> Path:
    """Build one archive (``which``: ``detector`` or ``pose``) into ``out`` with ``servetune archive``; its model
    name gets ``name_suffix`` (for a second archive of the same model with other settings)."""
    spec = MODELS[which]
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"{spec.name}-") as tmp:
        work = Path(tmp)
        weights = work / f"{spec.name}.pt"
        info = random_weights(spec, seed, weights)
        (work / "weights_info.json").write_text(json.dumps(info, indent=2))
        config = work / "model-config.yaml"
        config.write_text(yaml.safe_dump(model_config(spec, overrides or {}), sort_keys=False))
        extras = [str(HERE / "ad_common.py"), str(work / "weights_info.json")]
        # detector: class id -> name; pose: keypoint index -> COCO keypoint name
        names = {"1": "drawn_humanoid"} if which == "detector" else dict(enumerate(model_module(spec).KEYPOINT_NAMES))
        (work / "index_to_name.json").write_text(json.dumps({str(k): v for k, v in names.items()}))
        extras.append(str(work / "index_to_name.json"))
        command = [
            sys.executable, "-m", "servetune", "archive",
            "--model-name", spec.name + name_suffix,
            "--version", "1.0",
            "--model-file", str(HERE / spec.model_file),
            "--serialized-file", str(weights),
            "--handler", str(HERE / spec.handler),
            "--extra-files", ",".join(extras),
            "--config-file", str(config),
            "--export-path", str(out),
            "--archive-format", archive_format,
            "--force",
        ]  # fmt: skip
        if not quiet:
            print("$", shlex.join(["servetune", *command[3:]]), flush=True)
        done = subprocess.run(command, check=True, capture_output=True, text=True)
        return Path(done.stdout.strip().splitlines()[-1])


def build_archives(
    out: Path,
    *,
    seed: int = 0,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    archive_format: str = "default",
    quiet: bool = False,
) -> dict[str, Path]:
    """Build both archives into ``out``; ``overrides`` maps ``detector``/``pose`` to model-config.yaml changes."""
    overrides = overrides or {}
    unknown = set(overrides) - set(MODELS)
    if unknown:
        raise ValueError(f"overrides for unknown models {sorted(unknown)}; expected {sorted(MODELS)}")
    return {
        which: build_archive(
            which, out, seed=seed, overrides=overrides.get(which), archive_format=archive_format, quiet=quiet
        )
        for which in MODELS
    }


def parse_set(values: list[str]) -> dict[str, dict[str, Any]]:
    overrides: dict[str, dict[str, Any]] = {}
    for item in values:
        target, sep, assignment = item.partition(":")
        key, eq, raw = assignment.partition("=")
        if not sep or not eq or target not in MODELS or not key:
            raise SystemExit(f"--set {item!r}: expected MODEL:KEY=VALUE with MODEL one of {sorted(MODELS)}")
        overrides.setdefault(target, {})[key] = yaml.safe_load(raw)
    return overrides


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="model store directory to write the archives into")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    parser.add_argument(
        "--detector-size", type=int, help="detector input size: sets detector.min_size and max_size (default 512)"
    )
    parser.add_argument("--set", action="append", default=[], metavar="MODEL:KEY=VALUE", help="a model-config key")
    parser.add_argument("--fp16", action="store_true", help="also build drawn_humanoid_detector_fp16.mar")
    parser.add_argument(
        "--archive-format",
        default="default",
        choices=["default", "zip-store", "tgz", "no-archive"],
        help="as servetune archive's (default: deflated zip)",
    )
    args = parser.parse_args()
    overrides = parse_set(args.set)
    if args.detector_size is not None:
        overrides.setdefault("detector", {}).update(
            {"detector.min_size": args.detector_size, "detector.max_size": args.detector_size}
        )
    paths = build_archives(args.out, seed=args.seed, overrides=overrides, archive_format=args.archive_format)
    if args.fp16:
        fp16 = {**overrides.get("detector", {}), "optimization": "fp16"}
        paths["detector_fp16"] = build_archive(
            "detector",
            args.out,
            seed=args.seed,
            overrides=fp16,
            archive_format=args.archive_format,
            name_suffix="_fp16",
        )
    for path in paths.values():
        print(path)


if __name__ == "__main__":
    main()
