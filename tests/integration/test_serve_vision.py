"""``vllm serve`` with images in host emulation: the tiny Qwen3.5 composite behind one
real server process for the whole module (a server start costs 30-60 s here), driven
with the OpenAI client and plain HTTP.

- A chat completion about an image sent as a base64 data URL, and one read from a local
  file under ``--allowed-local-media-path``: the prompt vLLM renders and the greedy
  answer equal transformers' (its processor and ``Qwen3_5ForConditionalGeneration`` on
  the same pixels and the same chat template).
- Bad input answered with a 400 naming the cause, on a keep-alive connection that then
  serves a normal completion with the engine core alive: corrupt image bytes, a format
  that is not an image, more images than ``--limit-mm-per-prompt``, a 1 x 100000
  image (the processor's aspect-ratio limit and the image's size named), a data URL
  that is not base64, a picture sent as ``video_url`` (the server takes one video per
  prompt so that the video is decoded rather than refused by the limit).
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.conftest import child_env
from tests.integration.e2e_runner import run_hf_vl, synthetic_image
from tests.integration.serve_clients import (
    NAME,
    TIMEOUT,
    Client,
    assert_still_serving,
)
from vllm_kunlun.demo.server_process import ServerProcess, start_server
from vllm_kunlun.demo.tiny_model import write_tiny_model
from vllm_kunlun.demo.tiny_qwen3_5 import TinyQwen3_5Spec

pytestmark = pytest.mark.slow

TOKENS = 8
IMAGES_PER_PROMPT = 2
QUESTION = "what is in this picture ?"


def png(width: int, height: int, seed: int) -> bytes:
    """The synthetic image as PNG (lossless: the server decodes the same pixels)."""
    buf = io.BytesIO()
    synthetic_image(width, height, seed).save(buf, format="PNG")
    return buf.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def image_message(*urls: str, text: str = QUESTION) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [
        {"type": "image_url", "image_url": {"url": u}} for u in urls
    ]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("serve_vision")


@pytest.fixture(scope="module")
def model_dir(work: Path) -> str:
    return str(write_tiny_model(work / "tiny-vl", TinyQwen3_5Spec(layout="composite")))


@pytest.fixture(scope="module")
def media(work: Path) -> Path:
    root = work / "media"
    root.mkdir()
    (root / "picture.png").write_bytes(png(56, 40, 22))
    return root


@pytest.fixture(scope="module")
def server(model_dir: str, media: Path, work: Path) -> Iterator[ServerProcess]:
    args = [
        "--served-model-name",
        NAME,
        "--max-model-len",
        "512",
        "--max-num-seqs",
        "4",
        "--limit-mm-per-prompt",
        json.dumps({"image": IMAGES_PER_PROMPT, "video": 1}),
        "--allowed-local-media-path",
        str(media),
    ]
    env = child_env({"VLLM_KUNLUN_HOST_EMULATION": "1", "VLLM_LOGGING_LEVEL": "INFO"})
    srv = start_server(model_dir, args, env, log_dir=work)
    try:
        yield srv
    finally:
        srv.stop(timeout=10)


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{server.url}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0
    )


@pytest.fixture
def kept(server: ServerProcess) -> Iterator[Client]:
    c = Client(server)
    try:
        yield c
    finally:
        c.conn.close()


def _reference(model_dir: str, images: list[list[int]], text: str) -> dict[str, Any]:
    """transformers' prompt ids and greedy tokens for one user turn: the images, then
    ``text``, rendered by the checkpoint's chat template."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": text}]
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": content}],
        tokenize=False,
        add_generation_prompt=True,
    )
    job = {
        "name": "chat",
        "requests": [{"prompt": prompt, "images": images, "max_tokens": TOKENS}],
    }
    (row,) = run_hf_vl({"model": model_dir, "jobs": [job]})["jobs"]["chat"]
    return row


def _chat(client: openai.OpenAI, messages: list[dict[str, Any]]) -> Any:
    return client.chat.completions.create(
        model=NAME,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=TOKENS,
        temperature=0.0,
        extra_body={"return_token_ids": True},
    )


def test_chat_about_a_base64_image_equals_transformers(
    client: openai.OpenAI, model_dir: str
) -> None:
    resp = _chat(client, image_message(data_url(png(40, 56, 21))))
    want = _reference(model_dir, [[40, 56, 21]], QUESTION)
    assert resp.prompt_token_ids == want["prompt_token_ids"]  # type: ignore[attr-defined]
    assert resp.choices[0].token_ids == want["token_ids"]  # type: ignore[attr-defined]
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage is not None and resp.usage.completion_tokens == TOKENS
    # Another image, another answer: the pixels reached the model.
    other = _chat(client, image_message(data_url(png(40, 56, 23))))
    assert other.choices[0].token_ids != resp.choices[0].token_ids  # type: ignore[attr-defined]


def test_two_images_one_from_a_local_file(
    client: openai.OpenAI, model_dir: str, media: Path
) -> None:
    local = (media / "picture.png").as_uri()
    resp = _chat(client, image_message(data_url(png(32, 32, 24)), local))
    want = _reference(model_dir, [[32, 32, 24], [56, 40, 22]], QUESTION)
    assert resp.prompt_token_ids == want["prompt_token_ids"]  # type: ignore[attr-defined]
    assert resp.choices[0].token_ids == want["token_ids"]  # type: ignore[attr-defined]


def _refused(
    server: ServerProcess, kept: Client, messages: list[dict[str, Any]]
) -> str:
    body = {"model": NAME, "messages": messages, "max_tokens": TOKENS}
    status, answer = kept.post("/v1/chat/completions", json.dumps(body).encode())
    assert status == 400, answer
    message = answer["error"]["message"]
    assert_still_serving(server, kept)
    return str(message)


def test_corrupt_image_bytes_are_a_400_and_the_server_keeps_serving(
    server: ServerProcess, kept: Client
) -> None:
    broken = png(40, 56, 21)[:60] + b"\x00garbage" * 8  # a PNG header, then junk
    message = _refused(server, kept, image_message(data_url(broken)))
    assert "the image could not be decoded" in message, message


def test_a_format_that_is_not_an_image_is_a_400(
    server: ServerProcess, kept: Client
) -> None:
    text = data_url(b"this is plain text, not a picture", mime="text/plain")
    message = _refused(server, kept, image_message(text))
    assert "the image could not be decoded" in message, message
    assert "cannot identify image file" in message, message


def test_more_images_than_the_limit_are_a_400_naming_it(
    server: ServerProcess, kept: Client
) -> None:
    urls = [data_url(png(16, 16, s)) for s in range(IMAGES_PER_PROMPT + 1)]
    message = _refused(server, kept, image_message(*urls))
    assert f"At most {IMAGES_PER_PROMPT} image(s)" in message, message


def test_an_image_of_1_by_100000_pixels_is_a_400_naming_its_aspect_ratio(
    server: ServerProcess, kept: Client
) -> None:
    message = _refused(server, kept, image_message(data_url(png(100000, 1, 3))))
    assert "aspect ratio must be smaller than 200" in message, message
    assert "100000 x 1 pixels" in message and "Qwen3VLProcessor" in message, message


def test_a_data_url_that_is_not_base64_is_a_400_naming_it(
    server: ServerProcess, kept: Client
) -> None:
    message = _refused(server, kept, image_message("data:image/png,raw"))
    assert "not base64" in message and "data:image/png;base64," in message, message


def test_an_image_sent_as_video_url_is_a_400_naming_it(
    server: ServerProcess, kept: Client
) -> None:
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "video_url", "video_url": {"url": data_url(png(56, 40, 5))}},
                {"type": "text", "text": QUESTION},
            ],
        }
    ]
    message = _refused(server, kept, messages)
    assert "video could not be decoded" in message, message
    assert "a picture goes in image_url" in message, message
