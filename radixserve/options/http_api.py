"""Options: the HTTP server, SSL, the API surface, streaming and output parsers."""

from __future__ import annotations

from radixserve.defaults import DEFAULT_HOST, DEFAULT_PORT
from radixserve.options.choices import REASONING_PARSER_CHOICES, TOOL_CALL_PARSER_CHOICES
from radixserve.options.spec import IMPLEMENTED, OptionSpec, flag, value
from radixserve.options.value_types import INT, JSON_LIST, JSON_OBJECT, STR

AREA = "HTTP server and API"

OPTIONS: tuple[OptionSpec, ...] = (
    value(
        "--host", STR, DEFAULT_HOST, "Host address the HTTP server binds to.", support=IMPLEMENTED
    ),
    value("--port", INT, DEFAULT_PORT, "Port of the HTTP server.", support=IMPLEMENTED),
    value(
        "--fastapi-root-path",
        STR,
        "",
        "Root path when served behind a path-based proxy.",
        support=IMPLEMENTED,
    ),
    flag("--smg-grpc-mode", "Serve with the legacy SMG gRPC server instead of HTTP."),
    flag("--grpc-mode", "Deprecated spelling of --smg-grpc-mode."),
    value("--grpc-port", INT, None, "Port of the native gRPC server (off when unset)."),
    value("--sidecar", STR, None, "Module of a sidecar to start against the native gRPC server."),
    value("--sidecar-args", JSON_LIST, None, "JSON array of arguments for the sidecar module."),
    flag("--skip-server-warmup", "Skip the warmup request at startup.", support=IMPLEMENTED),
    value("--warmups", STR, None, "Comma-separated custom warmup functions to run before serving."),
    flag("--enable-http2", "Serve HTTP/2 (with Granian instead of Uvicorn)."),
    value(
        "--http2-max-concurrent-streams",
        INT,
        200,
        "Maximum concurrent streams per HTTP/2 connection.",
    ),
    value(
        "--http2-initial-connection-window-size",
        INT,
        1048576,
        "Initial HTTP/2 connection receive window in bytes.",
    ),
    value(
        "--ssl-keyfile",
        STR,
        None,
        "SSL private key file (serves HTTPS together with --ssl-certfile).",
        support=IMPLEMENTED,
    ),
    value(
        "--ssl-certfile",
        STR,
        None,
        "SSL certificate file (serves HTTPS together with --ssl-keyfile).",
        support=IMPLEMENTED,
    ),
    value("--ssl-ca-certs", STR, None, "CA certificates file."),
    value("--ssl-keyfile-password", STR, None, "Password of the SSL key file."),
    flag("--enable-ssl-refresh", "Reload SSL certificates when the files change."),
    value(
        "--api-key",
        STR,
        None,
        "API key required on requests (Authorization: Bearer ...).",
        support=IMPLEMENTED,
    ),
    value(
        "--admin-api-key", STR, None, "Separate API key for admin endpoints.", support=IMPLEMENTED
    ),
    value(
        "--max-payload-size",
        INT,
        None,
        "radixserve's own option (SGLang has none): the largest request body in bytes; a larger "
        "one is answered 413 before it is parsed. Unset: RADIXSERVE_MAX_REQUEST_BODY_BYTES, "
        "else 32 MiB.",
        support=IMPLEMENTED,
    ),
    flag(
        "--disable-web-ui",
        "radixserve's own option (SGLang has none): turn off the browser pages, the chat "
        "playground at / and /playground and the live dashboard at /dashboard (they answer 404).",
        support=IMPLEMENTED,
    ),
    value(
        "--served-model-name",
        STR,
        None,
        "Model name reported by the API (defaults to the model folder's or GGUF file's name; requests may also name the model path).",
        support=IMPLEMENTED,
    ),
    value(
        "--weight-version",
        STR,
        "default",
        "Version label of the model weights.",
        support=IMPLEMENTED,
    ),
    value(
        "--chat-template",
        STR,
        None,
        "Chat template name or file (defaults to the tokenizer's template).",
        support=IMPLEMENTED,
    ),
    value(
        "--hf-chat-template-name", STR, None, "Which named chat template of the tokenizer to use."
    ),
    value(
        "--completion-template", STR, None, "Completion template name or file (code completion)."
    ),
    value("--file-storage-path", STR, "sglang_storage", "Folder for files stored by the server."),
    flag(
        "--enable-cache-report",
        "Report cached prompt tokens in usage.prompt_tokens_details.",
        support=IMPLEMENTED,
    ),
    flag("--return-input-ids", "Return the prompt token ids in responses."),
    flag("--return-output-ids", "Return the generated token ids in responses."),
    value(
        "--default-chat-template-kwargs",
        JSON_OBJECT,
        None,
        "JSON object of default chat template kwargs for every request.",
    ),
    flag("--strip-thinking-cache", "Do not cache reasoning output in the radix tree."),
    flag("--enable-strict-thinking", "Block model-specific tokens during the thinking phase."),
    value("--tool-server", STR, None, "'demo' or comma-separated tool server URLs."),
    value(
        "--sampling-defaults",
        STR,
        "model",
        "Source of default sampling parameters: the model's generation_config.json ('model') or OpenAI defaults ('openai').",
        choices=("openai", "model"),
    ),
    value(
        "--asr-max-buffer-seconds",
        INT,
        60,
        "Maximum buffered audio seconds per streaming ASR session.",
    ),
    value("--asr-max-concurrent-sessions", INT, 32, "Maximum concurrent realtime ASR sessions."),
    value(
        "--preferred-sampling-params",
        JSON_OBJECT,
        None,
        "JSON sampling settings reported by /get_model_info.",
        support=IMPLEMENTED,
    ),
    flag(
        "--allow-auto-truncate",
        "Truncate over-long inputs instead of rejecting them.",
    ),
    value("--stream-interval", INT, 1, "Tokens per streamed chunk.", support=IMPLEMENTED),
    value("--batch-notify-size", INT, 16, "Streaming notifications batched per event-loop wakeup."),
    flag(
        "--stream-response-default-include-usage",
        "Include usage in every streaming response.",
        support=IMPLEMENTED,
    ),
    flag(
        "--incremental-streaming-output",
        "Stream disjoint text segments instead of cumulative text.",
    ),
    flag("--enable-streaming-session", "Enable streaming sessions."),
    flag("--enable-session-radix-cache", "Keep per-session KV as evictable radix cache entries."),
    value(
        "--constrained-json-whitespace-pattern",
        STR,
        None,
        "Regex of whitespace allowed in JSON constrained output (outlines, llguidance). When "
        "unset, whitespace between JSON tokens is bounded: one space or tab, or a newline and up "
        "to 20 spaces/tabs (outlines: one space).",
        support=IMPLEMENTED,
    ),
    flag(
        "--constrained-json-disable-any-whitespace",
        "Force compact JSON in constrained output (xgrammar, llguidance).",
        support=IMPLEMENTED,
    ),
    value(
        "--reasoning-parser",
        STR,
        None,
        "Parser that separates reasoning content from the answer.",
        choices=REASONING_PARSER_CHOICES,
        support=IMPLEMENTED,
        supported_choices=("deepseek-r1", "qwen3", "qwen3-thinking", "gpt-oss"),
    ),
    value(
        "--tool-call-parser",
        STR,
        None,
        "Parser that extracts tool calls from model output.",
        choices=TOOL_CALL_PARSER_CHOICES,
        support=IMPLEMENTED,
        supported_choices=("hermes", "llama3", "mistral", "qwen", "qwen25", "pythonic", "gpt-oss"),
    ),
    flag("--enable-response-store", "Store responses for the Responses API."),
)
