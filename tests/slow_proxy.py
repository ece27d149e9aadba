"""Ray Serve's proxy callback for a test: servetune's middlewares, after ``SLOW_PROXY_S`` seconds, so that the proxy
is slow to become ready (as on a busy host) and Serve's controller kills it and starts another."""

from __future__ import annotations

import os
import time
from typing import Any

from servetune.ray.proxy_errors import middlewares as servetune_middlewares


def middlewares() -> list[Any]:
    time.sleep(float(os.environ.get("SLOW_PROXY_S", "0")))
    return servetune_middlewares()
