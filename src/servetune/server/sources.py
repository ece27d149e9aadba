"""Where a model archive may come from: the model store, or a URL that ``allowed_urls`` admits.

Safe by default (ShellTorch, CVE-2023-43654): with no ``allowed_urls`` only files inside the model store
register; ``..`` is refused before anything is touched; redirects are not followed.
"""

from __future__ import annotations

import asyncio
import re
import urllib.parse
from pathlib import Path

from servetune._exceptions import ModelError

ARCHIVE_SUFFIXES = (".mar", ".tar.gz", ".tgz", ".zip")
MAX_DOWNLOAD_BYTES = 8 << 30


def _not_found(message: str) -> ModelError:
    return ModelError(message, 404, "ModelNotFoundException")


def _check_allowed(url: str, allowed: tuple[str, ...]) -> None:
    if not any(re.fullmatch(pattern, url, flags=re.IGNORECASE) for pattern in allowed):
        raise ModelError(f"Given URL {url} does not match any allowed URL(s)", 404, "ModelNotFoundException")


async def resolve(url: str, model_store: Path | None, allowed_urls: tuple[str, ...]) -> Path:
    """Return a local path for ``url`` (downloading into the model store if it is remote and allowed)."""
    if not url:
        raise _not_found("empty url")
    if any(ord(ch) < 32 for ch in url):
        raise ModelError("url must not contain control characters", 400, "BadRequestException")
    if ".." in url.replace("\\", "/").split("/") or "/../" in urllib.parse.unquote(url) or url.startswith(".."):
        raise _not_found(f"Relative path is not allowed in url: {url}")
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme in ("http", "https"):
        _check_allowed(url, allowed_urls)
        if model_store is None:
            raise ModelError("Model store is not set; cannot download archives", 400, "BadRequestException")
        return await _download(url, model_store)
    if parsed.scheme not in ("", "file"):
        raise ModelError(f"Unsupported url scheme: {parsed.scheme}", 400, "BadRequestException")
    raw_path = Path(urllib.parse.unquote(parsed.path) if parsed.scheme == "file" else url)
    if model_store is None:
        raise _not_found(f"Model not found in model store: {url} (no model store is set)")
    store = model_store.resolve()
    try:
        candidate = (raw_path if raw_path.is_absolute() else store / raw_path).resolve()
    except (OSError, ValueError) as exc:
        raise ModelError(f"Invalid url {url!r}: {exc}", 400, "BadRequestException") from None
    if not candidate.is_relative_to(store):
        # Outside the store: only if an allowed_urls pattern admits this file:// URL explicitly.
        _check_allowed(candidate.as_uri(), allowed_urls)
    if not candidate.exists():
        raise _not_found(f"Model not found in model store: {url}")
    return candidate


async def _download(url: str, model_store: Path) -> Path:
    import aiohttp

    name = Path(urllib.parse.urlparse(url).path).name
    if not name or not name.endswith(ARCHIVE_SUFFIXES):
        raise ModelError(f"url must name an archive file ({', '.join(ARCHIVE_SUFFIXES)}): {url}", 400)
    target = model_store / name
    if target.exists():
        raise ModelError(f"Model file already exists {name}", 500, "InternalServerException")
    partial = target.with_name(f".{name}.part")
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
            async with session.get(url, allow_redirects=False) as resp:
                if 300 <= resp.status < 400:
                    raise ModelError(f"Failed to download archive from: {url} (redirects are not followed)", 400)
                if resp.status != 200:
                    raise ModelError(f"Failed to download archive from: {url} (HTTP {resp.status})", 400)
                size = 0
                with partial.open("wb") as fh:
                    async for chunk in resp.content.iter_chunked(1 << 20):
                        size += len(chunk)
                        if size > MAX_DOWNLOAD_BYTES:
                            raise ModelError(f"Failed to download archive from: {url} (larger than 8 GiB)", 400)
                        await asyncio.to_thread(fh.write, chunk)
        partial.rename(target)
    except aiohttp.ClientError as exc:
        raise ModelError(f"Failed to download archive from: {url} ({exc})", 400) from None
    finally:
        partial.unlink(missing_ok=True)
    return target
