"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

router = APIRouter(tags=["health"])


# Async (no worker thread): health answers even while every thread of the pool is busy.
@router.api_route("/healthz", methods=["GET", "HEAD"], summary="The process answers (no auth needed)")
async def healthz() -> dict:
    return {"ok": True}


@router.api_route("/readyz", methods=["GET", "HEAD"], summary="The searcher is loaded (model, table): 503 until then")
async def readyz(request: Request):
    service = request.app.state.memory
    if service.ready:
        return {"ready": True}
    return JSONResponse({"ready": False, "error": service.warm_error or "loading the model and the table"}, status_code=503)
