"""The Animated Drawings app's calls to its model server, against servetune: detector -> crop -> pose.

As the app's ``image_to_annotations`` does: check ``GET /ping``; scale the drawing so its longest side is at most
1000 px; POST it as PNG in the multipart field ``data`` to ``/predictions/drawn_humanoid_detector``; sort the
detections by ``score`` and take ``[0]["bbox"]``; crop to it (rounded) and POST the crop to
``/predictions/drawn_humanoid_pose_estimator``; expect exactly one skeleton of 17 ``[x, y, score]`` keypoints
and rig it. Standard library only.

    python examples/animated_drawings/client.py drawing.png [--url http://127.0.0.1:8080] [--out annotations/]
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from PIL import Image

DETECTOR = "drawn_humanoid_detector"
POSE = "drawn_humanoid_pose_estimator"
MAX_SIDE = 1000

# The app's rig: joint name, COCO keypoints averaged for its location, parent joint.
RIG: list[tuple[str, tuple[int, ...], str | None]] = [
    ("root", (11, 12), None),
    ("hip", (11, 12), "root"),
    ("torso", (5, 6), "hip"),
    ("neck", (0,), "torso"),
    ("right_shoulder", (6,), "torso"),
    ("right_elbow", (8,), "right_shoulder"),
    ("right_hand", (10,), "right_elbow"),
    ("left_shoulder", (5,), "torso"),
    ("left_elbow", (7,), "left_shoulder"),
    ("left_hand", (9,), "left_elbow"),
    ("right_hip", (12,), "root"),
    ("right_knee", (14,), "right_hip"),
    ("right_foot", (16,), "right_knee"),
    ("left_hip", (11,), "root"),
    ("left_knee", (13,), "left_hip"),
    ("left_foot", (15,), "left_knee"),
]


class AnnotationError(Exception):
    """The server's answer is not what the app can use (an HTTP error, no detection, not exactly one skeleton)."""


def request(url: str, body: bytes | None = None, headers: dict[str, str] | None = None, timeout: float = 60) -> Any:
    """One HTTP call; the decoded JSON answer, or AnnotationError for a status >= 300."""
    req = urllib.request.Request(url, data=body, headers=headers or {}, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as err:
        raise AnnotationError(f"{url}: HTTP {err.code}: {err.read().decode('utf-8', 'replace')}") from None


def post_png(base_url: str, model: str, image: Image.Image, token: str | None = None) -> Any:
    """POST ``image`` as a PNG in the multipart form field ``data``, as the app's ``requests.post(files=...)``."""
    png = io.BytesIO()
    image.save(png, format="PNG")
    boundary = uuid.uuid4().hex
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="data"; filename="data"\r\n\r\n'.encode()
        + png.getvalue()
        + f"\r\n--{boundary}--\r\n".encode()
    )
    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return request(f"{base_url}/predictions/{model}", body, headers)


def annotate(image: Image.Image, base_url: str = "http://127.0.0.1:8080", token: str | None = None) -> dict[str, Any]:
    """Detect, crop and estimate the pose of the drawn figure in ``image``: what the app would save."""
    health = request(f"{base_url}/ping", headers={"Authorization": f"Bearer {token}"} if token else None)
    if health.get("status") != "Healthy":
        raise AnnotationError(f"{base_url}/ping: {health}")
    image = image.convert("RGB")
    if max(image.size) > MAX_SIDE:
        scale = MAX_SIDE / max(image.size)
        image = image.resize((round(scale * image.width), round(scale * image.height)))
    detections = post_png(base_url, DETECTOR, image, token)
    if not isinstance(detections, list) or not detections:
        raise AnnotationError(f"no drawn humanoid detected: {detections!r}")
    detections.sort(key=lambda d: d["score"], reverse=True)
    left, top, right, bottom = (round(v) for v in detections[0]["bbox"])
    # the app slices img[t:b, l:r]; keep at least one pixel so that the crop is an image
    left, top = min(max(left, 0), image.width - 1), min(max(top, 0), image.height - 1)
    right, bottom = max(min(right, image.width), left + 1), max(min(bottom, image.height), top + 1)
    cropped = image.crop((left, top, right, bottom))
    poses = post_png(base_url, POSE, cropped, token)
    if not isinstance(poses, list) or len(poses) != 1:
        raise AnnotationError(f"expected exactly one skeleton, got {poses!r}")
    keypoints = poses[0]["keypoints"]
    if len(keypoints) != 17 or any(len(k) != 3 for k in keypoints):
        raise AnnotationError(f"expected 17 [x, y, score] keypoints, got {keypoints!r}")
    skeleton = [
        {
            "loc": [round(sum(keypoints[i][axis] for i in ids) / len(ids)) for axis in (0, 1)],
            "name": name,
            "parent": parent,
        }
        for name, ids, parent in RIG
    ]
    return {
        "detections": len(detections),
        "score": detections[0]["score"],
        "bounding_box": {"left": left, "top": top, "right": right, "bottom": bottom},
        "keypoints": keypoints,
        "char_cfg": {"skeleton": skeleton, "height": cropped.height, "width": cropped.width},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("images", nargs="+", type=Path, help="drawings to annotate (PNG, JPEG)")
    parser.add_argument("--url", default="http://127.0.0.1:8080", help="inference address (default %(default)s)")
    parser.add_argument("--token", help="inference bearer token, when the server requires one")
    parser.add_argument("--out", type=Path, help="write <image stem>.json annotations into this directory")
    args = parser.parse_args()
    failed = 0
    for path in args.images:
        try:
            with Image.open(path) as image:
                result = annotate(image, args.url.rstrip("/"), args.token)
        except (AnnotationError, OSError) as exc:
            print(f"{path}: {exc}", file=sys.stderr)
            failed += 1
            continue
        box = result["bounding_box"]
        print(
            f"{path}: {result['detections']} detections, best score {result['score']:.3f}, box {box}, "
            f"{len(result['keypoints'])} keypoints"
        )
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"{path.stem}.json").write_text(json.dumps(result, indent=2))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
