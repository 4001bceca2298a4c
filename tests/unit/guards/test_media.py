"""Runtime patch ``image_decode_check``: vLLM's own image loader, with the patch, turns
bytes that do not decode into a ValueError naming the cause (a 400 from the servers),
and hands decodable images on unchanged."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from vllm.multimodal.media.image import ImageMediaIO

from tests.conftest import patch_state
from vllm_kunlun.guards import media


@pytest.fixture
def patched() -> Iterator[None]:
    with patch_state(media, on=True):
        yield


def _png(mode: str = "RGB") -> bytes:
    pixels = np.arange(24 * 16 * 3, dtype=np.uint8).reshape(16, 24, 3)
    buf = io.BytesIO()
    Image.fromarray(pixels).convert(mode).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture
def unpatched() -> Iterator[None]:
    """vLLM's own loader for one test, whatever an earlier test installed."""
    with patch_state(media, on=False):
        yield


@pytest.mark.usefixtures("unpatched")
def test_without_the_patch_a_truncated_png_passes_the_loader() -> None:
    """What the patch is for: vLLM's loader reads only the header of an RGB PNG."""
    loaded = ImageMediaIO().load_bytes(_png()[:80])
    with pytest.raises(OSError):
        loaded.media.load()


@pytest.mark.usefixtures("patched")
@pytest.mark.parametrize(
    ("data", "cause"),
    [
        (_png()[:80], "truncated"),
        (_png()[:60] + b"\x00junk" * 10, "OSError"),
        (b"plain text, not a picture", "cannot identify image file"),
    ],
    ids=["truncated", "corrupt", "not_an_image"],
)
def test_undecodable_bytes_are_a_value_error_naming_the_cause(
    data: bytes, cause: str
) -> None:
    with pytest.raises(ValueError) as refused:
        ImageMediaIO().load_bytes(data)
    message = str(refused.value)
    assert message.startswith("the image could not be decoded"), message
    assert cause in message and "PNG, JPEG" in message


@pytest.mark.usefixtures("patched")
@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L"])
def test_good_images_load_as_before(mode: str, tmp_path: Path) -> None:
    data = _png(mode)
    got = ImageMediaIO().load_bytes(data)
    assert got.media.mode == "RGB" and got.media.size == (24, 16)
    assert got.original_bytes == data
    path = tmp_path / "x.png"
    path.write_bytes(data)
    from_file = ImageMediaIO().load_file(path)
    assert np.array_equal(np.asarray(from_file.media), np.asarray(got.media))
    with pytest.raises(ValueError, match="could not be decoded"):
        path.write_bytes(data[:70])
        ImageMediaIO().load_file(path)


def _bomb_png() -> bytes:
    """A valid 1 x 1 PNG whose header then claims 100000 x 100000 pixels (the IHDR
    CRC recomputed): about 70 bytes that Pillow refuses to open."""
    import struct
    import zlib

    data = bytearray(_tiny_png())
    width_at = 16  # signature (8) + length (4) + "IHDR" (4)
    data[width_at : width_at + 8] = struct.pack(">II", 100000, 100000)
    crc = zlib.crc32(bytes(data[12:29])) & 0xFFFFFFFF
    data[29:33] = struct.pack(">I", crc)
    return bytes(data)


def _tiny_png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (1, 1)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.usefixtures("patched")
def test_a_decompression_bomb_is_a_value_error_naming_the_pixel_limit() -> None:
    bomb = _bomb_png()
    assert len(bomb) < 200
    with pytest.raises(Image.DecompressionBombError):  # what vLLM alone meets
        Image.open(io.BytesIO(bomb))
    with pytest.raises(ValueError) as refused:
        ImageMediaIO().load_bytes(bomb)
    message = str(refused.value)
    assert "more pixels than the server decodes" in message
    assert str(Image.MAX_IMAGE_PIXELS) in message
