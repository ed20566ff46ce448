"""`memory serve`: bind, check who may connect, and run the app on uvicorn."""

from __future__ import annotations

import os
import socket

from memory_pipeline.errors import ConfigError
from memory_pipeline.service.auth import TOKEN_ENV, is_loopback
from memory_pipeline.settings import Settings

DEFAULT_PORT = 8765


def check_bind(host: str, token: str | None) -> None:
    """Anything but loopback needs a bearer token (from ``$MEMORY_PIPELINE_TOKEN``)."""
    if not is_loopback(host) and not token:
        raise ConfigError(
            f"--host {host} is not a loopback address: set a bearer token in ${TOKEN_ENV} first",
            key="host",
            hint=f"export {TOKEN_ENV}=$(python -c 'import secrets; print(secrets.token_urlsafe(32))'), or serve on 127.0.0.1",
        )
    if token is not None and len(token) < 16:
        raise ConfigError(f"${TOKEN_ENV} is too short (16 characters at least)", key=TOKEN_ENV)


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as err:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {err.strerror or err}", key="port", hint="pick another --port (0 = any free port)") from err
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def serve(settings: Settings, *, host: str = "127.0.0.1", port: int = DEFAULT_PORT, assets_source: str | None = None,
          cors_origins: tuple[str, ...] = (), refresh_seconds: float = 0.25, log_level: str = "warning") -> None:  # fmt: skip
    import uvicorn

    from memory_pipeline.service.app import create_app

    token = os.environ.get(TOKEN_ENV) or None
    check_bind(host, token)
    if assets_source:
        settings.source(assets_source)  # an unknown name is a ConfigError now, not at the first ingest
    sock = bind(host, port)
    actual = sock.getsockname()[1]
    shown_host = f"[{host.strip('[]')}]" if ":" in host.strip("[]") else host
    url = f"http://{shown_host}:{actual}"
    app = create_app(settings, token=token, host=host, url=url, assets_source=assets_source, cors_origins=cors_origins,
                     refresh_seconds=refresh_seconds)  # fmt: skip
    print(f"memory serve: listening on {url} (OpenAPI {url}/openapi.json, MCP {url}/mcp)", flush=True)
    config = uvicorn.Config(app, log_level=log_level, access_log=False, timeout_graceful_shutdown=5, server_header=False)
    uvicorn.Server(config).run(sockets=[sock])
