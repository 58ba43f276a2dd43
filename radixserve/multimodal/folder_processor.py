"""The model folder's image processor (transformers' AutoImageProcessor), loaded on first use
by the API side's image expanders (grid_images.py, anyres_images.py), once per folder, from the
folder only (never the hub)."""

from __future__ import annotations

import threading
from typing import Any


class FolderImageProcessor:
    def __init__(self, model_dir: str) -> None:
        self.model_dir = model_dir
        self._processor: Any = None
        self._lock = threading.Lock()

    def _load(self) -> Any:
        with self._lock:
            if self._processor is None:
                from transformers import AutoImageProcessor

                self._processor = AutoImageProcessor.from_pretrained(
                    self.model_dir, local_files_only=True
                )
            return self._processor
