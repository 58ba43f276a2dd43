"""Fetching an http(s) image URL for a request, API side.

The fetch runs where images are already loaded: in a worker thread (Engine.async_generate hands
image loading to asyncio.to_thread), so a blocking client is enough and the event loop never
waits on a remote server. Every way a URL can fail is a 400 naming the request's field:
a host outside --allowed-media-domains (checked again at each redirect, so an allowed host
cannot bounce the server to another), an unreachable host or an HTTP error status, a fetch
that runs past the time limit, a body larger than --media-url-max-file-size-mb (reading stops
at the cap, whatever Content-Length claimed), and a body that is not an image.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import httpx

from radixserve.errors import InvalidRequestError

# The whole fetch (connect, redirects, body) must finish within this many seconds: httpx's own
# timeouts are per operation, so a server dripping one byte a second would never trip them.
FETCH_TIMEOUT_S = 10.0
# Redirects followed before giving up (each target is checked against the allowed domains).
MAX_REDIRECTS = 5
_CHUNK = 64 * 1024
# Content types a server may give an image under without naming it an image.
_GENERIC_TYPES = ("application/octet-stream", "binary/octet-stream")


def _host_key(host: str) -> str:
    return host.strip().rstrip(".").lower()


@dataclass(frozen=True)
class MediaFetchPolicy:
    """What the server may fetch: the byte cap of one download, the hosts allowed (empty: any
    host, as in SGLang when --allowed-media-domains is unset), the time limit and how many
    redirects are followed."""

    max_bytes: int
    allowed_domains: frozenset[str] = frozenset()
    timeout_s: float = FETCH_TIMEOUT_S
    max_redirects: int = MAX_REDIRECTS

    @classmethod
    def from_options(
        cls, max_file_size_mb: Any, allowed_domains: Iterable[str] | str | None
    ) -> MediaFetchPolicy:
        """From --media-url-max-file-size-mb and --allowed-media-domains; ValueError if bad."""
        if isinstance(max_file_size_mb, bool) or not isinstance(max_file_size_mb, int | float):
            raise ValueError("--media-url-max-file-size-mb must be a number of MiB")
        if max_file_size_mb <= 0:
            raise ValueError("--media-url-max-file-size-mb must be > 0")
        if isinstance(allowed_domains, str):
            allowed_domains = [allowed_domains]
        # Hosts compare case-insensitively and without a trailing dot ("Example.COM." is
        # example.com); an entry is one exact host name: subdomains are not implied.
        hosts = frozenset(_host_key(h) for h in allowed_domains or () if h.strip())
        return cls(int(max_file_size_mb * 1024 * 1024), hosts)

    def host_allowed(self, host: str | None) -> bool:
        if not self.allowed_domains:
            return True
        return host is not None and _host_key(host) in self.allowed_domains


def is_remote_url(source: str) -> bool:
    return source[:8].lower().startswith(("http://", "https://"))


def fetch_image_url(url: str, param: str, policy: MediaFetchPolicy) -> bytes:
    """The body of `url` (an image, up to the policy's cap); InvalidRequestError naming `param`
    for anything else."""
    deadline = time.monotonic() + policy.timeout_s
    try:
        target = httpx.URL(url)
    except (httpx.InvalidURL, ValueError) as exc:
        raise InvalidRequestError(f"The image URL is not a valid URL: {exc}", param) from exc
    timeout = httpx.Timeout(policy.timeout_s)
    try:
        with httpx.Client(timeout=timeout, follow_redirects=False) as client:
            for _ in range(policy.max_redirects + 1):
                _check_target(target, param, policy)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise _timed_out(url, param, policy)
                # Each hop may wait only for what is left of the whole fetch's time.
                with client.stream("GET", target, timeout=remaining) as response:
                    if response.is_redirect and response.next_request is not None:
                        target = response.next_request.url
                        continue
                    return _read_body(response, url, param, policy, deadline)
    except httpx.TimeoutException as exc:
        raise _timed_out(url, param, policy) from exc
    except httpx.HTTPError as exc:  # connection refused, DNS failure, TLS, protocol errors
        raise InvalidRequestError(
            f"The image URL {url} could not be fetched: {exc or type(exc).__name__}", param
        ) from exc
    raise InvalidRequestError(
        f"The image URL {url} redirected more than {policy.max_redirects} times.", param
    )


def _check_target(target: httpx.URL, param: str, policy: MediaFetchPolicy) -> None:
    if target.scheme not in ("http", "https"):
        raise InvalidRequestError(
            f"The image URL leads to a {target.scheme!r} URL; only http(s) is fetched.", param
        )
    if not policy.host_allowed(target.host):
        raise InvalidRequestError(
            f"The image URL's host {target.host!r} is not among the allowed media domains "
            "(--allowed-media-domains).",
            param,
        )


def _timed_out(url: str, param: str, policy: MediaFetchPolicy) -> InvalidRequestError:
    return InvalidRequestError(
        f"Fetching the image URL {url} timed out after {policy.timeout_s:g} s.", param
    )


def _too_large(url: str, param: str, policy: MediaFetchPolicy) -> InvalidRequestError:
    mib = policy.max_bytes / (1024 * 1024)
    return InvalidRequestError(
        f"The image at {url} is larger than {mib:g} MiB (--media-url-max-file-size-mb).", param
    )


def _read_body(
    response: httpx.Response, url: str, param: str, policy: MediaFetchPolicy, deadline: float
) -> bytes:
    if response.status_code >= 400 or response.is_redirect:
        raise InvalidRequestError(
            f"The image URL {url} answered HTTP {response.status_code}.", param
        )
    kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind and not kind.startswith("image/") and kind not in _GENERIC_TYPES:
        raise InvalidRequestError(
            f"The image URL {url} is not an image (its Content-Type is {kind!r}).", param
        )
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > policy.max_bytes:
        raise _too_large(url, param, policy)
    body = bytearray()
    for chunk in response.iter_bytes(_CHUNK):
        body += chunk
        # A server may send no Content-Length, or a wrong one: count what actually arrives and
        # stop reading as soon as it passes the cap.
        if len(body) > policy.max_bytes:
            raise _too_large(url, param, policy)
        if time.monotonic() > deadline:
            raise _timed_out(url, param, policy)
    if time.monotonic() > deadline:
        raise _timed_out(url, param, policy)
    return bytes(body)
