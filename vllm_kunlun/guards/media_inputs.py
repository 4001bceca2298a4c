"""Runtime patch ``media_input_checks``: a malformed data URL, a frame-list video or
bytes that are not a video are a 400 naming the cause and the fix.

Why: vLLM 0.15.1 parses media inputs with code that fails on such input with errors
that name nothing the client sent, and some of them are not ``ValueError``s, so the
servers answer 500 (or, through their error path, 200 with an error body):
- ``data:image/png,raw`` (no ``;base64``): ``ValueError: not enough values to unpack``;
- a ``video/jpeg`` data URL (a list of base64 JPEG frames): decoded, then the Qwen-VL
  video processor fails on ``VideoMetadata.__init__() missing total_num_frames``
  (vLLM's frame-list loader returns no metadata): the format is not served;
- a PNG sent as ``video_url``: numpy's ``UFuncTypeError`` from the video loader;
- an input the model's HF processor refuses (a 1 x 100000 image: Qwen-VL's
  ``absolute aspect ratio must be smaller than 200``): vLLM's ``ValueError`` says
  only "Failed to apply <processor> on data=..." and drops the processor's reason.
How: ``MediaConnector._load_data_url`` checks the URL's form before vLLM splits it;
``VideoMediaIO.load_base64`` refuses ``video/jpeg`` naming the formats that are
served; ``VideoMediaIO.load_bytes`` turns any failure to decode into a ``ValueError``
naming it; ``InputProcessingContext.call_hf_processor``'s refusal gets the
processor's own reason and the sizes of the images appended. Each refusal is a
``ValueError`` (400 from the servers).
Installed with the engine guards (``Phase.FRONT_END``).
Removal: when vLLM validates data URLs and video inputs while it parses a request.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

from vllm_kunlun.patching.attribute import AttributePatch, OptionalPatch, expect_params

NAME = "media_input_checks"
VIDEO_FORMATS = "a video file (MP4, WebM, MKV, AVI)"


class MediaInputError(ValueError):
    """A media input the server cannot read, named with the fix."""


def data_url_problem(path: str) -> str | None:
    """What is wrong with a data URL's path (what follows ``data:``), or None."""
    spec, comma, _ = path.partition(",")
    if not comma:
        return "it has no ',' before the data"
    media_type, semicolon, encoding = spec.partition(";")
    if not media_type.strip("/"):
        return "it names no media type (data:<type>;base64,<data>)"
    if not semicolon:
        return (
            f"it is not base64 (no ';base64' after {media_type.strip('/')!r}: the "
            "data would be read as raw text)"
        )
    if encoding != "base64":
        return f"its encoding is {encoding!r}; only base64 is read"
    return None


def _check(attr: str, params: tuple[str, ...]) -> Any:
    def check(module: ModuleType, original: Any) -> str | None:
        return expect_params(original, attr, params)

    return check


def _make_data_url(original: Any) -> Any:
    @functools.wraps(original)
    def load_data_url(self: Any, url_spec: Any, media_io: Any) -> Any:
        problem = data_url_problem(url_spec.path or "")
        if problem:
            raise MediaInputError(
                f"the data URL cannot be read: {problem}; send "
                "data:<media type>;base64,<base64 data>, e.g. "
                "data:image/png;base64,iVBORw0..."
            )
        return original(self, url_spec, media_io)

    return load_data_url


def _make_video_base64(original: Any) -> Any:
    @functools.wraps(original)
    def load_base64(self: Any, media_type: str, data: str) -> Any:
        if media_type.lower() == "video/jpeg":
            raise MediaInputError(
                "video/jpeg data URLs (a list of JPEG frames) are not served: vLLM "
                "0.15.1 reads no frame timing from them and the video processor "
                f"fails; send {VIDEO_FORMATS} as a base64 data URL or a URL, or the "
                "frames as separate image_url parts"
            )
        return original(self, media_type, data)

    return load_base64


def _make_video_bytes(original: Any) -> Any:
    @functools.wraps(original)
    def load_bytes(self: Any, data: bytes) -> Any:
        try:
            return original(self, data)
        except ValueError:
            raise
        except Exception as exc:
            raise MediaInputError(
                f"the video could not be decoded ({type(exc).__name__}: {exc}); send "
                f"{VIDEO_FORMATS} as video_url (a picture goes in image_url)"
            ) from None

    return load_bytes


def _sizes(data: Any) -> str:
    """``(images of W x H pixels)`` for the PIL images in a processor call's data."""
    images = data.get("images") if isinstance(data, dict) else None
    if images is None:
        return ""
    items = images if isinstance(images, (list, tuple)) else [images]
    sizes = [f"{i.size[0]} x {i.size[1]}" for i in items if hasattr(i, "size")]
    return f" (images of {', '.join(sizes)} pixels)" if sizes else ""


def _make_processor_call(original: Any) -> Any:
    @functools.wraps(original)
    def call_hf_processor(
        self: Any, hf_processor: Any, data: Any, *a: Any, **k: Any
    ) -> Any:
        try:
            return original(self, hf_processor, data, *a, **k)
        except ValueError as exc:
            cause = exc.__cause__
            if cause is None or str(cause) in str(exc):
                raise
            raise MediaInputError(
                f"{type(hf_processor).__name__} refused the request's media"
                f"{_sizes(data)}: {cause}; resize or re-encode the input to fit "
                "the model's processor"
            ) from exc

    return call_hf_processor


_PATCHES = (
    AttributePatch(
        NAME,
        "vllm.multimodal.utils",
        "MediaConnector._load_data_url",
        _make_data_url,
        _check("MediaConnector._load_data_url", ("self", "url_spec", "media_io")),
    ),
    AttributePatch(
        NAME,
        "vllm.multimodal.media.video",
        "VideoMediaIO.load_base64",
        _make_video_base64,
        _check("VideoMediaIO.load_base64", ("self", "media_type", "data")),
    ),
    AttributePatch(
        NAME,
        "vllm.multimodal.media.video",
        "VideoMediaIO.load_bytes",
        _make_video_bytes,
        _check("VideoMediaIO.load_bytes", ("self", "data")),
    ),
    AttributePatch(
        NAME,
        "vllm.multimodal.processing.context",
        "InputProcessingContext.call_hf_processor",
        _make_processor_call,
        _check(
            "InputProcessingContext.call_hf_processor",
            ("self", "hf_processor", "data", "kwargs", "num_tries", "max_tries"),
        ),
    ),
)


GUARD = OptionalPatch(NAME, _PATCHES, "malformed media inputs are left to vLLM")
install, installed, uninstall, RUNTIME_PATCHES = GUARD.bindings()
