"""Where a model archive may come from: the model store, or a URL that ``allowed_urls`` admits.

Safe by default (ShellTorch, CVE-2023-43654): with no ``allowed_urls`` only files inside the model store
register; ``..`` is refused before anything is touched; redirects are not followed; a url that names the model store
itself (``url=.``) is refused (400), never read as one model directory holding every archive.
"""

from __future__ import annotations

import asyncio
import re
import urllib.parse
from pathlib import Path

from servetune._exceptions import ApiError

ARCHIVE_SUFFIXES = (".mar", ".tar.gz", ".tgz", ".zip")
MAX_DOWNLOAD_BYTES = 8 << 30


def _not_found(message: str) -> ApiError:
    return ApiError.model_not_found("", message)


def _check_allowed(url: str, allowed: tuple[str, ...]) -> None:
    if not any(re.fullmatch(pattern, url, flags=re.IGNORECASE) for pattern in allowed):
        raise _not_found(f"Given URL {url} does not match any allowed URL(s)")


async def resolve(url: str, model_store: Path | None, allowed_urls: tuple[str, ...]) -> Path:
    """Return a local path for ``url`` (downloading into the model store if it is remote and allowed)."""
    if not url:
        raise _not_found("empty url")
    if any(ord(ch) < 32 for ch in url):
        raise ApiError.bad_request("url must not contain control characters")
    if ".." in url.replace("\\", "/").split("/") or "/../" in urllib.parse.unquote(url) or url.startswith(".."):
        raise _not_found(f"Relative path is not allowed in url: {url}")
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme in ("http", "https"):
        _check_allowed(url, allowed_urls)
        if model_store is None:
            raise ApiError.bad_request("Model store is not set; cannot download archives")
        return await _download(url, model_store)
    if parsed.scheme not in ("", "file"):
        raise ApiError.bad_request(f"Unsupported url scheme: {parsed.scheme}")
    raw_path = Path(urllib.parse.unquote(parsed.path) if parsed.scheme == "file" else url)
    if model_store is None:
        raise _not_found(f"Model not found in model store: {url} (no model store is set)")
    store = model_store.resolve()
    try:
        candidate = (raw_path if raw_path.is_absolute() else store / raw_path).resolve()
    except (OSError, ValueError) as exc:
        raise ApiError.bad_request(f"Invalid url {url!r}: {exc}") from None
    if candidate == store:
        raise ApiError.bad_request(
            f"url {url!r} names the model store itself; name an archive or a model directory inside it"
        )
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
        raise ApiError.bad_request(f"url must name an archive file ({', '.join(ARCHIVE_SUFFIXES)}): {url}")
    target = model_store / name
    if target.exists():
        raise ApiError.internal(f"Model file already exists {name}")
    partial = target.with_name(f".{name}.part")
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
            async with session.get(url, allow_redirects=False) as resp:
                if 300 <= resp.status < 400:
                    raise ApiError.download_failed(
                        f"Failed to download archive from: {url} (redirects are not followed)"
                    )
                if resp.status != 200:
                    raise ApiError.download_failed(f"Failed to download archive from: {url} (HTTP {resp.status})")
                size = 0
                with partial.open("wb") as fh:
                    async for chunk in resp.content.iter_chunked(1 << 20):
                        size += len(chunk)
                        if size > MAX_DOWNLOAD_BYTES:
                            raise ApiError.download_failed(
                                f"Failed to download archive from: {url} (larger than 8 GiB)"
                            )
                        await asyncio.to_thread(fh.write, chunk)
        partial.rename(target)
    except aiohttp.ClientError as exc:
        raise ApiError.download_failed(f"Failed to download archive from: {url} ({exc})") from None
    finally:
        partial.unlink(missing_ok=True)
    return target
