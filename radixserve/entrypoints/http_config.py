"""The slice of ServerArgs (and environment) the HTTP layer reads, resolved once at startup.

Reading through this frozen view keeps the routes independent of how ServerArgs is built, and
makes the fake-engine tests cheap: any object with the right attribute names will do.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from radixserve.defaults import DEFAULT_HOST, DEFAULT_PORT

# Bodies above this are refused with 413 before they are parsed.
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
MAX_BODY_ENV = "RADIXSERVE_MAX_REQUEST_BODY_BYTES"
# How long SIGTERM waits for in-flight requests before the server stops anyway.
DEFAULT_GRACE_S = 30.0
GRACE_ENV = "RADIXSERVE_GRACEFUL_SHUTDOWN_TIMEOUT"
# Set to 1 to let requests carry their own Jinja chat template (chat_template_kwargs).
ALLOW_REQUEST_TEMPLATE_ENV = "RADIXSERVE_ALLOW_REQUEST_CHAT_TEMPLATE"
# /health_generate gives up after this many seconds.
HEALTH_TIMEOUT_ENV = "RADIXSERVE_HEALTH_CHECK_TIMEOUT"
# SGLang's switch: when true, /health runs a one-token generation like /health_generate.
HEALTH_GENERATE_ENV = "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise ValueError(f"Environment variable {name} must be a number, got {raw!r}.") from exc
    if value <= 0:
        raise ValueError(f"Environment variable {name} must be positive, got {raw!r}.")
    return value


def _env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    return raw.strip().lower() in ("1", "true", "yes", "on")


def _max_body_bytes(option: Any) -> int:
    """--max-payload-size, else the environment variable, else 32 MiB."""
    if option is None:
        return int(_env_float(MAX_BODY_ENV, DEFAULT_MAX_BODY_BYTES))
    if isinstance(option, bool) or not isinstance(option, int) or option <= 0:
        raise ValueError(f"--max-payload-size must be a positive number of bytes, got {option!r}.")
    return option


@dataclass(frozen=True)
class HttpConfig:
    model_path: str
    tokenizer_path: str
    served_model_name: str
    api_key: str | None = None
    admin_api_key: str | None = None
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    root_path: str = ""
    ssl_keyfile: str | None = None
    ssl_certfile: str | None = None
    max_queued_requests: int | None = None
    max_running_requests: int | None = None
    chat_template: str | None = None
    enable_cache_report: bool = False
    enable_metrics: bool = False
    enable_web_ui: bool = True
    log_requests: bool = False
    log_requests_level: int = 2
    log_level: str = "info"
    log_level_http: str | None = None
    is_embedding: bool = False
    skip_server_warmup: bool = False
    incremental_streaming_output: bool = False
    stream_response_default_include_usage: bool = False
    weight_version: str = "default"
    preferred_sampling_params: Any = None
    access_log_exclude_prefixes: tuple[str, ...] = ()
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    graceful_shutdown_s: float = DEFAULT_GRACE_S
    health_timeout_s: float = 20.0
    health_generates: bool = False
    allow_request_chat_template: bool = False
    # Other names a request may use for the served model: the model path as typed and without a
    # trailing slash, as SGLang (whose default served name is the path) would accept them.
    model_aliases: tuple[str, ...] = ()

    @classmethod
    def from_server_args(cls, args: Any) -> HttpConfig:
        def get(name: str, default: Any = None) -> Any:
            value = getattr(args, name, default)
            return default if value is None else value

        model_path = str(get("model_path", ""))
        served = str(get("served_model_name", model_path) or model_path)
        return cls(
            model_path=model_path,
            tokenizer_path=str(get("tokenizer_path", model_path)),
            served_model_name=served,
            model_aliases=_path_aliases(model_path, served),
            api_key=get("api_key") or None,
            admin_api_key=get("admin_api_key") or None,
            host=str(get("host", DEFAULT_HOST)),
            port=int(get("port", DEFAULT_PORT)),
            root_path=str(get("fastapi_root_path", "")),
            ssl_keyfile=get("ssl_keyfile"),
            ssl_certfile=get("ssl_certfile"),
            max_queued_requests=get("max_queued_requests"),
            max_running_requests=get("max_running_requests"),
            chat_template=get("chat_template"),
            enable_cache_report=bool(get("enable_cache_report", False)),
            enable_metrics=bool(get("enable_metrics", False)),
            enable_web_ui=not bool(get("disable_web_ui", False)),
            log_requests=bool(get("log_requests", False)),
            log_requests_level=int(get("log_requests_level", 2)),
            log_level=str(get("log_level", "info")),
            log_level_http=get("log_level_http"),
            is_embedding=bool(get("is_embedding", False)),
            skip_server_warmup=bool(get("skip_server_warmup", False)),
            incremental_streaming_output=bool(get("incremental_streaming_output", False)),
            stream_response_default_include_usage=bool(
                get("stream_response_default_include_usage", False)
            ),
            weight_version=str(get("weight_version", "default")),
            preferred_sampling_params=get("preferred_sampling_params"),
            access_log_exclude_prefixes=tuple(get("uvicorn_access_log_exclude_prefixes", ()) or ()),
            max_body_bytes=_max_body_bytes(get("max_payload_size")),
            graceful_shutdown_s=_env_float(GRACE_ENV, DEFAULT_GRACE_S),
            health_timeout_s=_env_float(HEALTH_TIMEOUT_ENV, 20.0),
            health_generates=_env_bool(HEALTH_GENERATE_ENV, False),
            allow_request_chat_template=_env_bool(ALLOW_REQUEST_TEMPLATE_ENV, False),
        )


def _path_aliases(model_path: str, served: str) -> tuple[str, ...]:
    """The model path (as typed, and without a trailing slash) when the served name is the
    default one derived from it; an explicit --served-model-name is the only accepted name."""
    from radixserve.options.resolve import default_served_model_name

    if not model_path or served != default_served_model_name(model_path):
        return ()
    stripped = model_path.rstrip("/") or model_path
    return tuple(dict.fromkeys((model_path, stripped)))
