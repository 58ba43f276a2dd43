"""SGLang's custom logit processors (--enable-custom-logit-processor).

A request's `custom_logit_processor` is SGLang's serialized form: the JSON string
`{"callable": "<hex of dill.dumps(cls)>"}` that `CustomLogitProcessor.to_str()` makes. The
scheduler loads the class, makes one instance, and before sampling calls
`instance(logits, custom_param_list)` on the logits rows of the requests that named it (one
call per distinct processor), with each row's `custom_params` dict plus `"__req__"` (the
request, as SGLang passes it); the returned tensor replaces those rows.

Loading runs code the client sent: that is why the option is off by default and requests
carrying a processor answer 400 without it.
"""

from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from radixserve.errors import InvalidRequestError

if TYPE_CHECKING:  # the API process checks requests here and must not import torch
    import torch

logger = logging.getLogger(__name__)

DISABLED_MESSAGE = (
    "The server is not configured to enable custom logit processor. "
    "Please set `--enable-custom-logit-processor` to enable this feature."
)


def _dill() -> Any:
    try:
        import dill
    except ImportError as exc:  # a core dependency; only a broken install lacks it
        raise RuntimeError("custom logit processors need the dill package") from exc
    return dill


class CustomLogitProcessor(ABC):
    """Subclass, implement __call__, and send `MyProcessor.to_str()` in the request."""

    @abstractmethod
    def __call__(
        self, logits: torch.Tensor, custom_param_list: list[dict[str, Any]] | None = None
    ) -> torch.Tensor:
        raise NotImplementedError

    @classmethod
    def to_str(cls) -> str:
        return json.dumps({"callable": _dill().dumps(cls).hex()})


def check_serialized(value: Any) -> None:
    """The shape of SGLang's string, checked on the API side without loading any code."""
    if not isinstance(value, str):
        raise InvalidRequestError(
            "custom_logit_processor must be a string.", "custom_logit_processor"
        )
    try:
        data = json.loads(value)
        payload = data["callable"]
        bytes.fromhex(payload)
    except (ValueError, TypeError, KeyError) as exc:
        raise InvalidRequestError(
            'custom_logit_processor must be the JSON {"callable": "<hex>"} that '
            "CustomLogitProcessor.to_str() makes.",
            "custom_logit_processor",
        ) from exc


@lru_cache(maxsize=64)
def load_processor(serialized: str) -> Any:
    """An instance of the serialized class (cached: a processor is loaded once)."""
    check_serialized(serialized)
    try:
        obj = _dill().loads(bytes.fromhex(json.loads(serialized)["callable"]))
        processor = obj() if isinstance(obj, type) else obj
    except Exception as exc:
        raise InvalidRequestError(
            f"custom_logit_processor could not be loaded: {type(exc).__name__}: {exc}",
            "custom_logit_processor",
        ) from exc
    if not callable(processor):
        raise InvalidRequestError(
            "custom_logit_processor is not callable.", "custom_logit_processor"
        )
    return processor


def apply_processors(logits: torch.Tensor, rows: Sequence[int], reqs: Sequence[Any]) -> None:
    """Run each distinct processor on its requests' rows of `logits`, in place. A processor
    that raises or returns the wrong shape leaves its rows alone and marks its requests
    (`custom_logit_error`) so the scheduler ends only them. `reqs` are the scheduler's Req
    objects (typed loosely: sampling/ does not import managers/)."""
    import torch

    groups: dict[str, list[int]] = {}
    for j, req in enumerate(reqs):
        if req.custom_logit_processor is not None:
            groups.setdefault(req.custom_logit_processor, []).append(j)
    for serialized, members in groups.items():
        index = torch.tensor([rows[j] for j in members], device=logits.device)
        params = [
            {**(reqs[j].sampling_params.custom_params or {}), "__req__": reqs[j]} for j in members
        ]
        try:
            out = load_processor(serialized)(logits[index], params)
            if not isinstance(out, torch.Tensor) or out.shape != (len(members), logits.shape[-1]):
                raise ValueError("it must return a tensor shaped like the logits it was given")
            with torch.inference_mode():  # the logits are inference tensors
                logits[index] = out.to(logits.dtype)
        except Exception as exc:
            logger.warning("Custom logit processor failed: %s", exc)
            for j in members:
                reqs[j].custom_logit_error = f"The custom logit processor failed: {exc}"
