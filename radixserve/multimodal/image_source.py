"""An image as a request gives it (a data URL, bare base64, or a local file path) -> its bytes,
checked to decode as an image, and a content hash. API side: a bad image is a 400 here, before
anything is queued. http(s) URLs are refused for now (the server does not fetch)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import os
from dataclasses import dataclass
from pathlib import Path

from radixserve.errors import InvalidRequestError

# Decoded images larger than this many pixels are refused (Pillow's own bomb guard is 2x this).
MAX_IMAGE_PIXELS = 89_478_485


@dataclass(frozen=True)
class LoadedImage:
    data: bytes  # the encoded file (PNG, JPEG, ...), as given
    hash: int  # a 64-bit content hash of `data`


def load_image(source: object, param: str) -> LoadedImage:
    """Read and check one image; raises InvalidRequestError naming `param`."""
    if not isinstance(source, str) or not source:
        raise InvalidRequestError("An image must be a non-empty string.", param)
    data = _read_bytes(source, param)
    _check_decodes(data, param)
    digest = hashlib.sha256(data).digest()
    return LoadedImage(data, int.from_bytes(digest[:8], "little"))


def _read_bytes(source: str, param: str) -> bytes:
    lowered = source[:16].lower()
    if lowered.startswith(("http://", "https://")):
        raise InvalidRequestError(
            "Image URLs over http(s) are not fetched by this server; send the image as a "
            "base64 data URL (data:image/png;base64,...) or a local file path.",
            param,
        )
    if lowered.startswith("data:"):
        header, sep, payload = source.partition(",")
        if not sep or ";base64" not in header.lower():
            raise InvalidRequestError("An image data URL must be base64-encoded.", param)
        return _b64(payload, param)
    if lowered.startswith("file://"):
        return _read_file(source[len("file://") :], param)
    if _looks_like_path(source):
        return _read_file(source, param)
    return _b64(source, param)


def _looks_like_path(source: str) -> bool:
    return source.startswith(("/", "./", "../", "~")) or (
        len(source) < 4096 and os.path.sep in source and Path(source).expanduser().is_file()
    )


def _read_file(path: str, param: str) -> bytes:
    try:
        return Path(path).expanduser().read_bytes()
    except OSError as exc:
        raise InvalidRequestError(f"The image file {path!r} cannot be read.", param) from exc


def _b64(payload: str, param: str) -> bytes:
    try:
        return base64.b64decode(payload.strip(), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidRequestError(
            "The image is neither a data URL, a readable file path nor valid base64.", param
        ) from exc


def _check_decodes(data: bytes, param: str) -> None:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            if width * height > MAX_IMAGE_PIXELS:
                raise InvalidRequestError(
                    f"The image is too large ({width}x{height} pixels).", param
                )
            image.load()
    except InvalidRequestError:
        raise
    except UnidentifiedImageError as exc:  # its message holds a BytesIO's repr
        raise InvalidRequestError(
            "The image cannot be decoded: not an image format this server reads.", param
        ) from exc
    except Exception as exc:  # Pillow raises many types for broken or unknown files
        raise InvalidRequestError(f"The image cannot be decoded: {exc}", param) from exc
