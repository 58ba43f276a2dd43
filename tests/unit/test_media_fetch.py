"""http(s) image URLs fetched for a request (multimodal/media_fetch.py), against a local server:
the image's bytes, or a 400 naming the field for a host not allowed (also after a redirect), an
unreachable host, an HTTP error, a timeout, a body over the cap (with or without
Content-Length), a body that is not an image, too many redirects."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from radixserve.errors import InvalidRequestError
from radixserve.multimodal.image_source import load_image
from radixserve.multimodal.media_fetch import MediaFetchPolicy, fetch_image_url
from radixserve.multimodal.request_images import RequestImages
from tests.helpers.image_server import ImageServer, Route, closed_port_url, image_server
from tests.helpers.tiny_llava import png_bytes

PARAM = "image_data[0]"
ANY_HOST = MediaFetchPolicy(max_bytes=1 << 20)


@pytest.fixture(scope="module")
def server() -> Iterator[ImageServer]:
    with image_server() as srv:
        srv.routes["/cat.png"] = Route(png_bytes(1))
        yield srv


def _refused(url: str, policy: MediaFetchPolicy = ANY_HOST) -> str:
    with pytest.raises(InvalidRequestError) as info:
        load_image(url, PARAM, policy)
    assert info.value.param == PARAM
    return str(info.value)


def test_fetches_an_image(server: ImageServer) -> None:
    loaded = load_image(server.url("/cat.png"), PARAM, ANY_HOST)
    assert loaded.data == png_bytes(1)
    # The same bytes as a data URL hash the same (the prefix cache keys on content).
    import base64

    inline = load_image("data:image/png;base64," + base64.b64encode(png_bytes(1)).decode(), PARAM)
    assert inline.hash == loaded.hash


def test_without_a_policy_urls_are_refused(server: ImageServer) -> None:
    with pytest.raises(InvalidRequestError, match="not fetched"):
        load_image(server.url("/cat.png"), PARAM)


def test_allowed_domains(server: ImageServer) -> None:
    only_localhost = MediaFetchPolicy.from_options(1, ["LOCALHOST."])
    assert load_image(server.url("/cat.png", "localhost"), PARAM, only_localhost).data
    assert "allowed media domains" in _refused(server.url("/cat.png"), only_localhost)
    # An allowed host cannot redirect the server to another host.
    server.routes["/to-ip"] = Route(location=server.url("/cat.png"))
    message = _refused(server.url("/to-ip", "localhost"), only_localhost)
    assert "'127.0.0.1'" in message and "allowed media domains" in message


def test_redirects_are_followed_a_bounded_number_of_times(server: ImageServer) -> None:
    server.routes["/moved"] = Route(location="/cat.png", status=301)
    assert load_image(server.url("/moved"), PARAM, ANY_HOST).data == png_bytes(1)
    server.routes["/loop"] = Route(location="/loop")
    server.routes["/loop"].hits.clear()
    assert "redirected more than 5 times" in _refused(server.url("/loop"))
    assert len(server.routes["/loop"].hits) == 6
    # A redirect may not lead off http(s) (a local file, say).
    server.routes["/to-file"] = Route(location="file:///etc/hostname")
    assert "only http(s)" in _refused(server.url("/to-file"))


def test_unreachable_and_http_errors(server: ImageServer) -> None:
    assert "could not be fetched" in _refused(closed_port_url())
    assert "HTTP 404" in _refused(server.url("/missing.png"))
    server.routes["/boom"] = Route(b"oops", status=500, content_type="text/plain")
    assert "HTTP 500" in _refused(server.url("/boom"))


def test_timeout(server: ImageServer) -> None:
    server.routes["/slow"] = Route(png_bytes(1), delay_s=2.0)
    quick = MediaFetchPolicy(max_bytes=1 << 20, timeout_s=0.3)
    assert "timed out" in _refused(server.url("/slow"), quick)


def test_too_large_stops_reading(server: ImageServer) -> None:
    big = b"\x89PNG" + b"\0" * 300_000
    server.routes["/big"] = Route(big)
    server.routes["/big-stream"] = Route(big, send_length=False)
    small = MediaFetchPolicy(max_bytes=100_000)
    assert "larger than" in _refused(server.url("/big"), small)
    assert "larger than" in _refused(server.url("/big-stream"), small)
    # Under the cap the same streamed body is read whole (then fails to decode: not a PNG).
    assert "decoded" in _refused(server.url("/big-stream"), MediaFetchPolicy(max_bytes=1 << 20))


def test_not_an_image(server: ImageServer) -> None:
    server.routes["/page"] = Route(b"<html></html>", content_type="text/html; charset=utf-8")
    assert "not an image" in _refused(server.url("/page"))
    server.routes["/blob"] = Route(b"just bytes", content_type="application/octet-stream")
    assert "decoded" in _refused(server.url("/blob"))


def test_invalid_urls() -> None:
    with pytest.raises(InvalidRequestError):
        fetch_image_url("http://", PARAM, ANY_HOST)


def test_options_are_checked() -> None:
    assert MediaFetchPolicy.from_options(64, ()).max_bytes == 64 * 1024 * 1024
    assert MediaFetchPolicy.from_options(2, "a.example").allowed_domains == {"a.example"}
    with pytest.raises(ValueError):
        MediaFetchPolicy.from_options(0, ())


def test_request_images_limit_is_checked_before_fetching(server: ImageServer) -> None:
    from radixserve.multimodal.image_prompt import ImagePrompt

    server.routes["/counted.png"] = Route(png_bytes(2))
    images = RequestImages(ImagePrompt(token_id=9, tokens_per_image=4), limit=1, fetch=ANY_HOST)
    url = server.url("/counted.png")
    with pytest.raises(InvalidRequestError, match="at most 1"):
        images.expand([1, 9, 9], [url, url])
    assert server.routes["/counted.png"].hits == []


def test_policy_from_the_command_line() -> None:
    from radixserve.server_args import ServerArgs

    args = ServerArgs.from_cli(
        [
            "--model-path",
            "x",
            "--allowed-media-domains",
            "a.example",
            "B.example",
            "--media-url-max-file-size-mb",
            "3",
        ]
    )
    policy = MediaFetchPolicy.from_options(
        args.media_url_max_file_size_mb, args.allowed_media_domains
    )
    assert policy.allowed_domains == {"a.example", "b.example"}
    assert policy.max_bytes == 3 * 1024 * 1024
