"""Runtime patch ``media_fetch_limit``: vLLM's own HTTP connection, with the patch, reads
a media URL up to ``VLLM_KUNLUN_MAX_MEDIA_MIB`` and refuses a larger body with a
ValueError naming the limit (a 400 from the servers), whether the server declares the
size or streams it; bodies under the limit come back byte for byte.

The server is a loopback ``http.server`` in a thread: real sockets, vLLM's real
``requests`` / ``aiohttp`` clients."""

from __future__ import annotations

import asyncio
import http.server
import threading
from collections.abc import Iterator

import pytest
from vllm.connections import HTTPConnection

from vllm_kunlun.guards import media

MIB = 1 << 20


class _Handler(http.server.BaseHTTPRequestHandler):
    sent: list[int] = []  # bytes the server got out per request

    def do_GET(self) -> None:
        if self.path.startswith("/missing/"):
            self.send_error(404)
            return
        size = int(self.path.strip("/").split("/")[-1])
        declared = self.path.startswith("/declared/")
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        if declared:
            self.send_header("Content-Length", str(size))
        else:
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        sent = 0
        block = b"x" * 65536
        try:
            while sent < size:
                piece = block[: min(len(block), size - sent)]
                if declared:
                    self.wfile.write(piece)
                else:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                sent += len(piece)
            if not declared:
                self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client stopped reading: what the limit is for
        _Handler.sent.append(sent)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def limited(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("VLLM_KUNLUN_MAX_MEDIA_MIB", "1")
    was = media.fetch_limit_installed()
    assert media.install_fetch_limit() or was
    try:
        yield
    finally:
        if not was:
            media.uninstall_fetch_limit()


def _get(url: str, use_async: bool) -> bytes:
    conn = HTTPConnection(reuse_client=False)
    if use_async:

        async def fetch() -> bytes:
            try:
                return await conn.async_get_bytes(url, timeout=30)
            finally:
                if conn._async_client is not None:
                    await conn._async_client.close()

        return asyncio.run(fetch())
    return conn.get_bytes(url, timeout=30)


@pytest.mark.usefixtures("limited")
@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("how", ["declared", "streamed"])
def test_a_body_over_the_limit_is_a_value_error_naming_it(
    server: str, use_async: bool, how: str
) -> None:
    _Handler.sent.clear()
    with pytest.raises(ValueError) as refused:
        _get(f"{server}/{how}/{8 * MIB}", use_async)
    message = str(refused.value)
    assert "1 MiB" in message and "VLLM_KUNLUN_MAX_MEDIA_MIB" in message
    assert isinstance(refused.value, media.MediaTooLargeError)


@pytest.mark.usefixtures("limited")
@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("how", ["declared", "streamed"])
def test_a_body_under_the_limit_comes_back_whole(
    server: str, use_async: bool, how: str
) -> None:
    got = _get(f"{server}/{how}/{MIB - 100}", use_async)
    assert got == b"x" * (MIB - 100)


def test_without_the_patch_vllm_reads_any_size(server: str) -> None:
    """What the patch is for: vLLM's reader takes the whole body."""
    was = media.fetch_limit_installed()
    media.uninstall_fetch_limit()
    try:
        assert len(_get(f"{server}/streamed/{3 * MIB}", use_async=False)) == 3 * MIB
    finally:
        if was:
            media.install_fetch_limit()


@pytest.mark.usefixtures("limited")
@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_an_unreachable_url_is_a_value_error_naming_it(use_async: bool) -> None:
    """Port 9 (discard) on the loopback: connection refused. vLLM alone raises the
    client library's error, which its routes answer as an internal error."""
    url = "http://127.0.0.1:9/picture.png"
    with pytest.raises(media.MediaFetchError) as refused:
        _get(url, use_async)
    assert url in str(refused.value) and "could not be fetched" in str(refused.value)


@pytest.mark.usefixtures("limited")
@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_an_http_error_status_is_a_value_error_naming_it(
    server: str, use_async: bool
) -> None:
    with pytest.raises(media.MediaFetchError, match="404"):
        _get(f"{server}/missing/", use_async)
