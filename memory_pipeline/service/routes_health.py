"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="The process answers (no auth needed)")
def healthz() -> dict:
    return {"ok": True}


@router.get("/readyz", summary="The searcher is loaded (model, table): 503 until then")
def readyz(request: Request):
    service = request.app.state.memory
    if service.ready:
        return {"ready": True}
    return JSONResponse({"ready": False, "error": service.warm_error or "loading the model and the table"}, status_code=503)
