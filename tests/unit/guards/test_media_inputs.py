"""Runtime patch ``media_input_checks``: vLLM's own ``MediaConnector`` and
``VideoMediaIO``, with the patch, refuse a malformed data URL, a frame-list video and a
picture sent as a video with a ValueError naming the cause and the fix (a 400); without
it they fail with errors that name nothing the client sent, some not ValueErrors (a
500). Well-formed inputs load as before."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator

import pytest
from PIL import Image
from vllm.multimodal.utils import MediaConnector

from tests.conftest import patch_state
from vllm_kunlun.guards import media_inputs


def _png_b64() -> str:
    buf = io.BytesIO()
    Image.new("RGB", (8, 6), (10, 20, 30)).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


@pytest.fixture
def patched() -> Iterator[None]:
    with patch_state(media_inputs, on=True):
        yield


@pytest.fixture
def unpatched() -> Iterator[None]:
    with patch_state(media_inputs, on=False):
        yield


FRAMES = f"data:video/jpeg;base64,{_png_b64()},{_png_b64()}"
PNG_AS_VIDEO = f"data:video/mp4;base64,{_png_b64()}"


@pytest.mark.usefixtures("unpatched")
def test_without_the_patch_vllm_names_nothing_the_client_sent() -> None:
    with pytest.raises(ValueError, match="not enough values to unpack"):
        MediaConnector().fetch_image("data:image/png,raw")
    with pytest.raises(Exception) as raised:
        MediaConnector().fetch_video(PNG_AS_VIDEO)
    assert not isinstance(raised.value, ValueError)  # a 500 from the servers


@pytest.mark.usefixtures("patched")
@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("data:image/png,raw", "it is not base64 (no ';base64' after 'image/png'"),
        ("data:;base64,abc", "names no media type"),
        ("data:image/png;utf8,abc", "only base64 is read"),
        ("data:image/png;base64", "no ','"),
    ],
)
def test_malformed_data_urls_are_named(url: str, words: str) -> None:
    with pytest.raises(ValueError) as refused:
        MediaConnector().fetch_image(url)
    assert words in str(refused.value) and "data:<media type>;base64," in str(
        refused.value
    )


@pytest.mark.usefixtures("patched")
def test_a_frame_list_video_is_refused_naming_what_is_served() -> None:
    with pytest.raises(ValueError, match=r"video/jpeg data URLs .* are not served"):
        MediaConnector().fetch_video(FRAMES)


@pytest.mark.usefixtures("patched")
def test_a_picture_sent_as_video_is_a_value_error_naming_image_url() -> None:
    with pytest.raises(ValueError) as refused:
        MediaConnector().fetch_video(PNG_AS_VIDEO)
    assert "could not be decoded" in str(refused.value)
    assert "image_url" in str(refused.value)


@pytest.mark.usefixtures("patched")
def test_a_well_formed_image_data_url_loads_as_before() -> None:
    image = MediaConnector().fetch_image(f"data:image/png;base64,{_png_b64()}")
    assert image.size == (8, 6) and image.getpixel((0, 0)) == (10, 20, 30)
