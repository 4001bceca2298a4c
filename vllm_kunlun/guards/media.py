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
from vllm_kunlun.patching.attribute import AttributePatch, OptionalPatch, expect_params

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


# Both wrappers or neither; a vLLM whose image loader differs keeps its own behaviour.
DECODE = OptionalPatch(NAME, _PATCHES, "an undecodable image is left to vLLM (a 500)")
install, installed, uninstall = DECODE.install, DECODE.installed, DECODE.uninstall


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


class _Body:
    """A response body read up to the limit: the declared ``Content-Length`` is
    checked before the first byte, the running size after every chunk."""

    def __init__(self, url: str, headers: Any) -> None:
        self.url, self.limit, self.data = url, media_limit_bytes(), bytearray()
        declared = headers.get("Content-Length") if headers is not None else None
        size = int(declared) if declared and declared.strip().isdigit() else 0
        if size > self.limit:
            raise _too_large(url, f"Content-Length {size} bytes")

    def add(self, chunk: bytes) -> None:
        self.data += chunk
        if len(self.data) > self.limit:
            raise _too_large(self.url, f"over {self.limit} bytes read")


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

        try:
            with self.get_response(
                url, stream=True, timeout=timeout, allow_redirects=allow_redirects
            ) as r:
                r.raise_for_status()
                body = _Body(url, r.headers)
                for chunk in r.iter_content(_CHUNK):
                    body.add(chunk)
                return bytes(body.data)
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

        try:
            async with await self.get_async_response(
                url, timeout=timeout, allow_redirects=allow_redirects
            ) as r:
                r.raise_for_status()
                body = _Body(url, r.headers)
                async for chunk in r.content.iter_chunked(_CHUNK):
                    body.add(chunk)
                return bytes(body.data)
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


FETCH = OptionalPatch(
    FETCH_NAME, _FETCH_PATCHES, "media URLs are read whole, whatever their size"
)
install_fetch_limit = FETCH.install
fetch_limit_installed = FETCH.installed
uninstall_fetch_limit = FETCH.uninstall

RUNTIME_PATCHES = {**DECODE.hooks(), **FETCH.hooks()}
