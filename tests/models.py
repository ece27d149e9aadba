"""Archives with known behaviour, built for tests with servetune's own archiver."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import yaml

from servetune.archive import create_archive

# A handler whose cost is known: it sleeps batch_ms + item_ms * len(batch) per batch (model-config.yaml
# key ``sleep``), and obeys control bodies so that tests can provoke faults on purpose ("stream:N" sends N intermediate
# answers first). It declares its OIP metadata (``model_metadata``).
SLEEP_HANDLER = textwrap.dedent(
    """
    import json
    import os
    import sys
    import time

    def model_metadata():
        return {"platform": "python_sleep", "inputs": [{"name": "body", "datatype": "BYTES", "shape": [-1]}]}

    def handle(data, context):
        if data is None:
            cfg = context.model_yaml_config.get("sleep", {})
            if cfg.get("fail_load"):
                raise RuntimeError("cannot load: fail_load is set")
            if cfg.get("import_torch"):  # a model that uses torch: its threads are set as it imports it
                import torch
            marker = cfg.get("fail_load_if_exists")
            if marker and os.path.exists(marker):
                os._exit(4)
            time.sleep(float(cfg.get("load_s", 0.0)))
            if cfg.get("cuda_mb"):  # hold this much GPU memory, for the describe API to report
                import torch
                context.held = torch.zeros(int(cfg["cuda_mb"]) * 2**18, device="cuda")
            return None
        cfg = context.model_yaml_config.get("sleep", {})
        if context.get_request_header(0, "describe") == "True":
            return [{"handler": "sleep", "config": cfg, "batch": len(data)}]
        bodies = [row.get("data") or row.get("body") for row in data]
        if cfg.get("record"):
            with open(cfg["record"], "a") as fh:
                for body in bodies:
                    fh.write((body.decode() if isinstance(body, (bytes, bytearray)) else str(body)) + "\\n")
        for body in bodies:
            if body in (b"exit", bytearray(b"exit"), "exit"):
                os._exit(3)
            if body in (b"boom", bytearray(b"boom"), "boom"):
                raise ValueError("boom requested")
            if isinstance(body, (bytes, bytearray)) and body.startswith(b"sleep:"):
                time.sleep(float(body[6:]))
            if isinstance(body, (bytes, bytearray)) and body.startswith(b"stream:"):
                from ts.handler_utils.utils import send_intermediate_predict_response

                for i in range(int(body[7:])):
                    send_intermediate_predict_response([f"part {i}"], context.request_ids, "Intermediate", 200, context)
        ms = float(cfg.get("batch_ms", 0.0)) + float(cfg.get("item_ms", 0.0)) * len(data)
        threads = sys.modules["torch"].get_num_threads() if "torch" in sys.modules else None
        if cfg.get("per_thread"):  # a model that speeds up with its intra-op threads in full
            from servetune.handlers.spec import cpu_settings

            threads = max(1, cpu_settings().num_threads)
            ms /= threads
        time.sleep(ms / 1000.0)
        out = []
        for body in bodies:
            echo = body.decode("utf-8", "replace") if isinstance(body, (bytes, bytearray)) else body
            configured = context.system_properties.get("batch_size")
            out.append({"batch_size": len(data), "configured": configured, "threads": threads, "pid": os.getpid(),
                        "echo": echo})
        return out
    """
)


def handler_archive(
    store: Path,
    name: str,
    handler_file: str,
    source: str,
    model_config: dict[str, Any],
    *,
    version: str = "1.0",
    archive_format: str = "default",
) -> Path:
    """Build ``<store>/<name>.mar`` from a handler's source and its model-config.yaml (sources kept in a dot folder
    of the store)."""
    store.mkdir(parents=True, exist_ok=True)
    src = store / f".src-{name}-{version}"
    src.mkdir(exist_ok=True)
    handler = src / handler_file
    handler.write_text(source)
    config_file = src / "model-config.yaml"
    config_file.write_text(yaml.safe_dump(model_config))
    return create_archive(
        model_name=name,
        version=version,
        handler=str(handler),
        config_file=str(config_file),
        export_path=str(store),
        archive_format=archive_format,
        force=True,
    )


def sleep_archive(
    store: Path,
    name: str = "sleep",
    batch_ms: float = 20.0,
    item_ms: float = 0.0,
    *,
    version: str = "1.0",
    model_config: dict[str, Any] | None = None,
    archive_format: str = "default",
) -> Path:
    """Build ``<store>/<name>.mar`` whose handler sleeps ``batch_ms + item_ms * batch_size`` per batch."""
    config = {**(model_config or {})}
    config.setdefault("sleep", {}).update({"batch_ms": batch_ms, "item_ms": item_ms})
    return handler_archive(
        store, name, "sleep_handler.py", SLEEP_HANDLER, config, version=version, archive_format=archive_format
    )


# The handler answers the model config it was given, so that a test sees what reached the worker.
ECHO_HANDLER = textwrap.dedent(
    """
    import json

    def handle(data, context):
        if data is None:
            return None
        return [json.dumps(context.model_yaml_config, sort_keys=True) for _ in data]
    """
)

# A 254-byte "billion laughs": 9**7 strings once its aliases are expanded.
LAUGHS = "a: &a [lol,lol,lol,lol,lol,lol,lol,lol,lol]\n" + "".join(
    f"{c}: &{c} [{','.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdef", "bcdefg", strict=True)
)
# 48 aliases (within SnakeYAML's 50) that still expand 3**16 times: the JSON size limit stops it.
CHAIN = "a0: &a0 [xxxxxxxxxx]\n" + "".join(f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}]\n" for i in range(1, 17))


def yaml_archive(store: Path, name: str, text: str, source: str = ECHO_HANDLER) -> Path:
    """``<store>/<name>.mar`` with this exact model-config.yaml text (not re-dumped: YAML's own tags survive)."""
    src = store / f".src-{name}"
    src.mkdir(parents=True, exist_ok=True)
    (src / "echo.py").write_text(source)
    (src / "model-config.yaml").write_text(text)
    return create_archive(
        model_name=name,
        version="1.0",
        handler=str(src / "echo.py"),
        config_file=str(src / "model-config.yaml"),
        export_path=str(store),
        force=True,
    )
