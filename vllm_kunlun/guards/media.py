"""Runtime patches ``image_decode_check`` and ``media_fetch_limit``: an image that does
not decode, or a media URL whose body is too large, is a 400 naming the cause.

Why: vLLM 0.15.1's ``ImageMediaIO`` opens an image lazily (``PIL.Image.open`` reads the
header only) and converts it only where its mode differs. An RGB PNG whose data is
truncated or corrupt passes the chat parser and fails later, inside the multimodal
processor (``OSError: image file is truncated``): the server answers an internal error
(code 500) for what is a bad request.
How: ``ImageMediaIO.load_bytes`` and ``load_file`` are wrapped to decode the pixels
while the request is parsed and to turn a failure to open or decode into a
``ValueError`` naming the cause and the fix; vLLM's chat and completion servers answer
a ``ValueError`` from parsing with 400. Bytes that are not an image at all (a text file
behind an ``image/png`` data URL) get the same answer, and so does a small file that
declares more pixels than Pillow decodes (``DecompressionBombError``: a 100-byte PNG
of 100000 x 100000, which vLLM answers 200 with an internal-error body). The decode is
work the processor does anyway (the decoded image is the one it gets).

``media_fetch_limit``: vLLM reads an image or video URL's whole body into the API
server's memory (``HTTPConnection.get_bytes`` / ``async_get_bytes``), whatever its
size, within the fetch timeout: a 1.5 GB body added 1.3 GB of resident memory that
stayed. The wrapped readers refuse a declared ``Content-Length`` over
``VLLM_KUNLUN_MAX_MEDIA_MIB`` before reading, and stop reading a body that grows past
it; either is a ``ValueError`` (400) naming the limit and the variable. A URL that
cannot be fetched (refused, unreachable, timed out, an HTTP error status) is a
``ValueError`` naming the URL and the cause as well: the request's fault, not the
server's (vLLM answers it with status 200 and an internal-error body).
Installed with the engine guards (``Phase.FRONT_END``: the processes that parse
requests).
Removal: when vLLM decodes images while it parses a request.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

from PIL import Image

from vllm_kunlun import envs
from vllm_kunlun.patching.attribute import (
    AttributePatch,
    apply_group_or_warn,
    expect_params,
    group_applied,
    revert_group,
)

NAME = "image_decode_check"
MODULE = "vllm.multimodal.media.image"
_PARAMS = {
    "ImageMediaIO.load_bytes": ("self", "data"),
    "ImageMediaIO.load_file": ("self", "filepath"),
}


class ImageDecodeError(ValueError):
    """The request's image bytes are not a decodable image."""


def decoded(loaded: Any) -> Any:
    """``loaded`` (vLLM's ``MediaWithBytes`` or a PIL image) with its pixels decoded;
    ``ImageDecodeError`` when they do not decode."""
    image = getattr(loaded, "media", loaded)
    try:
        image.load()
    except _UNDECODABLE as exc:
        raise ImageDecodeError(_message(exc)) from None
    return loaded


# Pillow's refusal of a huge declared size is neither an OSError nor a ValueError.
_UNDECODABLE = (OSError, SyntaxError, ValueError, Image.DecompressionBombError)


def _message(exc: BaseException) -> str:
    if isinstance(exc, Image.DecompressionBombError):
        return (
            f"the image declares more pixels than the server decodes ({exc}); send an "
            f"image of at most {Image.MAX_IMAGE_PIXELS} pixels (the vision processor "
            "resizes to far fewer anyway)"
        )
    return (
        f"the image could not be decoded ({type(exc).__name__}: {exc}); send a "
        "complete image file in a format Pillow reads (PNG, JPEG, WebP, GIF, BMP, "
        "TIFF)"
    )


def _check(attr: str) -> Any:
    def check(module: ModuleType, original: Any) -> str | None:
        return expect_params(original, attr, _PARAMS[attr])

    return check


def _make(original: Any) -> Any:
    @functools.wraps(original)
    def load(self: Any, source: Any) -> Any:
        try:
            loaded = original(self, source)
        # PIL.UnidentifiedImageError is an OSError; a decompression bomb is neither.
        except (OSError, SyntaxError, Image.DecompressionBombError) as exc:
            raise ImageDecodeError(_message(exc)) from None
        return decoded(loaded)

    return load


_PATCHES = tuple(
    AttributePatch(NAME, MODULE, attr, _make, _check(attr)) for attr in _PARAMS
)


def install() -> bool:
    """Both wrappers or neither; True when this call installed them. A vLLM whose
    image loader differs keeps its own behaviour, with a warning."""
    return apply_group_or_warn(_PATCHES, "an undecodable image is left to vLLM (a 500)")


def installed() -> bool:
    return group_applied(_PATCHES)


def uninstall() -> None:
    """Put vLLM's original methods back."""
    revert_group(_PATCHES)


FETCH_NAME = "media_fetch_limit"
FETCH_MODULE = "vllm.connections"
_FETCH_PARAMS = {
    "HTTPConnection.get_bytes": ("self", "url", "timeout", "allow_redirects"),
    "HTTPConnection.async_get_bytes": ("self", "url", "timeout", "allow_redirects"),
}
_CHUNK = 1 << 16


class MediaTooLargeError(ValueError):
    """A media URL's body is larger than ``VLLM_KUNLUN_MAX_MEDIA_MIB``."""


class MediaFetchError(ValueError):
    """A media URL that could not be fetched."""


def _fetch_failed(url: str, exc: BaseException) -> MediaFetchError:
    cause = str(exc) or type(exc).__name__
    return MediaFetchError(
        f"the media at {url} could not be fetched ({type(exc).__name__}: {cause}); "
        "send a URL this server can reach, or the data inline as a data: URL"
    )


def media_limit_bytes() -> int:
    return int(envs.VLLM_KUNLUN_MAX_MEDIA_MIB * (1 << 20))


def _too_large(url: str, size: str) -> MediaTooLargeError:
    return MediaTooLargeError(
        f"the media at {url} is larger than this server reads ({size}; the limit is "
        f"{envs.VLLM_KUNLUN_MAX_MEDIA_MIB:g} MiB); send a smaller file, or raise "
        "VLLM_KUNLUN_MAX_MEDIA_MIB on the server"
    )


def _check_declared(url: str, headers: Any, limit: int) -> None:
    declared = headers.get("Content-Length") if headers is not None else None
    if declared is not None and declared.strip().isdigit() and int(declared) > limit:
        raise _too_large(url, f"Content-Length {int(declared)} bytes")


def _bounded_get_bytes(original: Any) -> Any:
    @functools.wraps(original)
    def get_bytes(
        self: Any,
        url: str,
        *,
        timeout: float | None = None,
        allow_redirects: bool = True,
    ) -> bytes:
        import requests

        limit = media_limit_bytes()
        try:
            with self.get_response(
                url, stream=True, timeout=timeout, allow_redirects=allow_redirects
            ) as r:
                r.raise_for_status()
                _check_declared(url, r.headers, limit)
                body = bytearray()
                for chunk in r.iter_content(_CHUNK):
                    body += chunk
                    if len(body) > limit:
                        raise _too_large(url, f"over {limit} bytes read")
                return bytes(body)
        except requests.RequestException as exc:
            raise _fetch_failed(url, exc) from None

    return get_bytes


def _bounded_async_get_bytes(original: Any) -> Any:
    @functools.wraps(original)
    async def async_get_bytes(
        self: Any,
        url: str,
        *,
        timeout: float | None = None,
        allow_redirects: bool = True,
    ) -> bytes:
        import asyncio

        import aiohttp

        limit = media_limit_bytes()
        try:
            async with await self.get_async_response(
                url, timeout=timeout, allow_redirects=allow_redirects
            ) as r:
                r.raise_for_status()
                _check_declared(url, r.headers, limit)
                body = bytearray()
                async for chunk in r.content.iter_chunked(_CHUNK):
                    body += chunk
                    if len(body) > limit:
                        raise _too_large(url, f"over {limit} bytes read")
                return bytes(body)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise _fetch_failed(url, exc) from None

    return async_get_bytes


def _fetch_check(attr: str) -> Any:
    def check(module: ModuleType, original: Any) -> str | None:
        return expect_params(original, attr, _FETCH_PARAMS[attr])

    return check


_FETCH_PATCHES = (
    AttributePatch(
        FETCH_NAME,
        FETCH_MODULE,
        "HTTPConnection.get_bytes",
        _bounded_get_bytes,
        _fetch_check("HTTPConnection.get_bytes"),
    ),
    AttributePatch(
        FETCH_NAME,
        FETCH_MODULE,
        "HTTPConnection.async_get_bytes",
        _bounded_async_get_bytes,
        _fetch_check("HTTPConnection.async_get_bytes"),
    ),
)


def install_fetch_limit() -> bool:
    """Both bounded readers or neither; True when this call installed them."""
    return apply_group_or_warn(
        _FETCH_PATCHES, "media URLs are read whole, whatever their size"
    )


def fetch_limit_installed() -> bool:
    return group_applied(_FETCH_PATCHES)


def uninstall_fetch_limit() -> None:
    revert_group(_FETCH_PATCHES)


RUNTIME_PATCHES = {  # phases.apply_phase's hook
    NAME: lambda phase: install(),
    FETCH_NAME: lambda phase: install_fetch_limit(),
}
