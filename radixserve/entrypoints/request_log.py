"""`--log-requests`: one line when a request arrives and one when it finishes.

Detail follows `--log-requests-level` (SGLang's levels): 0 metadata only, 1 adds sampling
parameters, 2 adds the first 2048 characters of input and output, 3 logs them whole. Headers
are never logged, so neither is the API key.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

logger = logging.getLogger("radixserve.requests")

PARTIAL_CHARS = 2048


class RequestLogger:
    def __init__(self, enabled: bool, level: int = 2) -> None:
        self.enabled = enabled
        self.level = level

    def _clip(self, value: Any) -> str:
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        if self.level >= 3 or len(text) <= PARTIAL_CHARS:
            return text
        return text[:PARTIAL_CHARS] + f"...(+{len(text) - PARTIAL_CHARS} chars)"

    def received(
        self, route: str, rid: str, inputs: Any, sampling_params: Mapping[str, Any] | None
    ) -> None:
        if not self.enabled:
            return
        parts = [f"Receive: route={route} rid={rid}"]
        if self.level >= 1 and sampling_params is not None:
            parts.append(f"sampling_params={self._clip(dict(sampling_params))}")
        if self.level >= 2:
            parts.append(f"input={self._clip(inputs)}")
        logger.info(" ".join(parts))

    def finished(self, route: str, rid: str, output: Any, meta: Mapping[str, Any]) -> None:
        if not self.enabled:
            return
        keys = ("prompt_tokens", "completion_tokens", "cached_tokens", "finish_reason")
        summary = {k: meta.get(k) for k in keys}
        parts = [f"Finish: route={route} rid={rid} meta={json.dumps(summary, default=str)}"]
        if self.level >= 2:
            parts.append(f"output={self._clip(output)}")
        logger.info(" ".join(parts))
