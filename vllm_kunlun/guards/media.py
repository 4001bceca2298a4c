"""Runtime patch ``image_decode_check``: an image that does not decode is a 400 naming
the cause, not a 500.

Why: vLLM 0.15.1's ``ImageMediaIO`` opens an image lazily (``PIL.Image.open`` reads the
header only) and converts it only where its mode differs. An RGB PNG whose data is
truncated or corrupt passes the chat parser and fails later, inside the multimodal
processor (``OSError: image file is truncated``): the server answers an internal error
(code 500) for what is a bad request.
How: ``ImageMediaIO.load_bytes`` and ``load_file`` are wrapped to decode the pixels
while the request is parsed and to turn a failure to open or decode into a
``ValueError`` naming the cause and the fix; vLLM's chat and completion servers answer
a ``ValueError`` from parsing with 400. Bytes that are not an image at all (a text file
behind an ``image/png`` data URL) get the same answer. The decode is work the processor
does anyway (the decoded image is the one it gets).
Installed with the engine guards (``Phase.FRONT_END``: the processes that parse
requests).
Removal: when vLLM decodes images while it parses a request.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

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
    except (OSError, SyntaxError, ValueError) as exc:
        raise ImageDecodeError(_message(exc)) from None
    return loaded


def _message(exc: BaseException) -> str:
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
        except (OSError, SyntaxError) as exc:  # PIL.UnidentifiedImageError included
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


RUNTIME_PATCHES = {NAME: lambda phase: install()}  # phases.apply_phase's hook


def installed() -> bool:
    return group_applied(_PATCHES)


def uninstall() -> None:
    """Put vLLM's original methods back."""
    revert_group(_PATCHES)
