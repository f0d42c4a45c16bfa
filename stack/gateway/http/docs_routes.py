"""/openapi.json and /docs behind the same keys as /v1/* (open when /v1 is open), or off (gateway.docs)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse

from stack.gateway.http.openai_routes import client_key


def docs_router(app: FastAPI) -> APIRouter:
    router = APIRouter(dependencies=[Depends(client_key)], include_in_schema=False)

    @router.get("/openapi.json")
    async def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    @router.get("/docs")
    async def docs() -> HTMLResponse:
        # With keys set, the browser's fetch of /openapi.json needs the key too (a header, like /v1).
        return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{app.title} - docs")

    return router
