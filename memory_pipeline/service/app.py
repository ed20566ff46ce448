"""The ASGI app of `memory serve`: FastAPI routes, the MCP endpoint, auth, limits, errors.

``create_app`` wires ``MemoryService`` (search, lines, notes, status) and ``AssetService`` (the
AgentOS multimodal routes) to HTTP, mounts the MCP server's streamable HTTP endpoint at ``/mcp``
and translates every error into a JSON body naming the field: 4xx for what the caller can fix,
503 while the index cannot answer, and never a traceback.
"""

from __future__ import annotations

import contextlib
import logging
import threading

from memory_pipeline import storage
from memory_pipeline.errors import ConfigError, MemoryPipelineError, ProviderError, SearchError, StoreError
from memory_pipeline.service.core import NotFound, TooLarge, Unsupported
from memory_pipeline.settings import Settings

log = logging.getLogger("memory_pipeline.service")
LOOPBACK_HOSTS = ["127.0.0.1", "localhost", "[::1]", "::1"]


def _status_of(err: MemoryPipelineError) -> int:
    from memory_pipeline.service.indexer import IndexWorkerError

    if isinstance(err, IndexWorkerError):
        return 500  # a crash or a bug in the index worker, not the request's fault
    if isinstance(err, NotFound):
        return 404
    if isinstance(err, TooLarge):
        return 413
    if isinstance(err, Unsupported):
        return 415
    if isinstance(err, (ConfigError, SearchError)):
        return 422
    if isinstance(err, (StoreError, ProviderError)):
        return 503
    return 400


def _field_of(loc) -> str:
    """``("body", "types", 0)`` → ``types.0``: the field, without where it was (body, query, path, …)."""
    parts = [str(p) for p in loc]
    if len(parts) > 1 and parts[0] in ("body", "query", "path", "form", "header", "cookie"):
        parts = parts[1:]
    return ".".join(parts) or "body"


def create_app(
    settings: Settings,
    *,
    token: str | None = None,
    host: str = "127.0.0.1",
    url: str | None = None,
    assets_source: str | None = None,
    cors_origins: tuple[str, ...] = (),
    refresh_seconds: float = 0.25,
    warm: bool = True,
):
    """The FastAPI app; ``url`` (when given) is written to the data folder's server file while it runs."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    from memory_pipeline import __version__
    from memory_pipeline.service import serverfile
    from memory_pipeline.service.assets import AssetService
    from memory_pipeline.service.auth import BearerAuth, is_loopback
    from memory_pipeline.service.core import MemoryService
    from memory_pipeline.service.limits import BodyLimit
    from memory_pipeline.service.mcp_server import build_mcp
    from memory_pipeline.service.routes_health import router as health_router
    from memory_pipeline.service.routes_memory import router as memory_router
    from memory_pipeline.service.routes_rag import router as rag_router

    service = MemoryService(settings, refresh_seconds=refresh_seconds)
    assets = AssetService(service, source=assets_source)
    mcp = build_mcp(service)
    mcp_app = mcp.streamable_http_app(streamable_http_path="/mcp", stateless_http=True, json_response=True, host=host)

    def _warm() -> None:
        try:
            service.searcher.warm()
            service.ready = True
        except Exception as err:  # noqa: BLE001 - /readyz says why; searches will say it again
            service.warm_error = f"{type(err).__name__}: {err}"
            log.warning("the searcher could not be opened: %s", service.warm_error)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        if warm:
            threading.Thread(target=_warm, name="memory-warm", daemon=True).start()
        else:
            service.ready = True
        if url:
            serverfile.write(storage.of(settings).root, url, token_required=bool(token), config=str(settings.config_path or ""))
        try:
            async with mcp.session_manager.run():
                yield
        finally:
            service.close()
            if url:
                serverfile.remove(storage.of(settings).root)

    app = FastAPI(
        title="memory_pipeline",
        version=__version__,
        description="Long-term memory for agents: search, read, write notes, AgentOS multimodal assets, MCP at /mcp.",
        lifespan=lifespan,
        # FastAPI's /docs and /redoc pages load their scripts from a CDN: on this server's origin such
        # a script could read every memory through the API, and offline the page is blank. The
        # schema itself is served at /openapi.json.
        docs_url=None,
        redoc_url=None,
    )
    app.state.memory = service
    app.state.assets = assets
    app.state.mcp = mcp

    @app.exception_handler(MemoryPipelineError)
    async def _ours(request: Request, err: MemoryPipelineError):
        hint = err.hint if not (isinstance(err, ConfigError) and err.hint == ConfigError("").hint) else ""
        body = {"error": str(err), "field": getattr(err, "key", "") or None, "hint": hint or None}
        return JSONResponse(body, status_code=_status_of(err))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, err: RequestValidationError):
        errors = err.errors()
        first = errors[0] if errors else {"loc": ("body",), "msg": "invalid request"}
        if first.get("type") == "json_invalid":
            # Its loc is ("body", character position): the field is the body, the position goes in the message.
            loc = first.get("loc", ())
            where = f" at character {loc[1]}" if len(loc) > 1 else ""
            why = (first.get("ctx") or {}).get("error", "")
            message = f"body: not valid JSON{where}{': ' + str(why) if why else ''}"
            return JSONResponse({"error": message, "field": "body", "hint": None}, status_code=422)
        field = _field_of(first.get("loc", ()))
        return JSONResponse({"error": f"{field}: {first.get('msg', 'invalid')}", "field": field, "hint": None}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, err: StarletteHTTPException):
        field = "body" if err.status_code == 400 else None
        return JSONResponse({"error": str(err.detail), "field": field, "hint": None}, status_code=err.status_code, headers=getattr(err, "headers", None))

    @app.exception_handler(Exception)
    async def _bug(request: Request, err: Exception):
        log.error("unexpected error on %s %s: %s: %s", request.method, request.url.path, type(err).__name__, err)
        return JSONResponse(
            {"error": f"unexpected error: {type(err).__name__}", "field": None, "hint": "a bug in memory_pipeline: please report it"}, status_code=500
        )

    app.include_router(health_router)
    app.include_router(memory_router)
    app.include_router(rag_router)
    app.router.routes.extend(mcp_app.routes)  # POST/GET/DELETE /mcp: the MCP streamable HTTP endpoint

    # Outermost last: auth first, then the body cap, then host checks and CORS.
    if cors_origins:
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["*"], allow_headers=["*"])
    if is_loopback(host):
        # A browser page on another site must not reach the loopback server by DNS rebinding.
        from memory_pipeline.service.auth import LoopbackHost

        app.add_middleware(LoopbackHost, hosts=LOOPBACK_HOSTS)
    app.add_middleware(BodyLimit, limit=settings.multimodal.max_file_bytes)
    if token:
        app.add_middleware(BearerAuth, token=token)
    return app
