"""/openapi.json: the server's routes and request bodies, from the pydantic models that parse
them, so that a schema-driven fuzzer (tests/server/test_fuzz.py) or a client generator sees
exactly what the server accepts. The endpoints read raw bodies (they are decoded off the event
loop), so FastAPI cannot derive this itself."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from flashlane import __version__
from flashlane.server.protocol import (
    ChatRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)

# path -> (method, request body model or None, what it does)
ROUTES: dict[str, tuple[str, type[BaseModel] | None, str]] = {
    "/v1/chat/completions": ("post", ChatRequest, "A chat reply, whole or streamed (SSE)."),
    "/v1/completions": ("post", CompletionRequest, "Replies to text or token-id prompts."),
    "/v1/models": ("get", None, "The served model."),
    "/tokenize": ("post", TokenizeRequest, "Token ids of a prompt or rendered messages."),
    "/detokenize": ("post", DetokenizeRequest, "The text of token ids."),
    "/health": ("get", None, "200 while serving; 503 loading, draining or failed."),
    "/metrics": ("get", None, "Prometheus metrics (--metrics-key)."),
}
_REF = "#/components/schemas/{model}"
_ERROR_REF = {"$ref": "#/components/schemas/Error"}
_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}


def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of the routes in ROUTES."""
    schemas: dict[str, Any] = {"Error": _ERROR}
    paths: dict[str, Any] = {}
    error = {"description": "An error in OpenAI's shape.", "content": _json(_ERROR_REF)}
    for path, (method, model, summary) in ROUTES.items():
        operation: dict[str, Any] = {
            "operationId": path.strip("/").replace("/", "_"),
            "summary": summary,
            "responses": {"200": {"description": "OK"}, "4XX": error, "5XX": error},
        }
        if model is not None:
            schema = model.model_json_schema(ref_template=_REF, mode="validation")
            schemas.update(schema.pop("$defs", {}))
            schemas[model.__name__] = schema
            body = _json({"$ref": _ref(model.__name__)})
            operation["requestBody"] = {"required": True, "content": body}
        paths[path] = {method: operation}
    return {
        "openapi": "3.1.0",
        "info": {"title": "flashlane", "version": __version__},
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        # the key is needed only when the server runs with --api-key
        "security": [{"bearer": []}, {}],
    }


def _ref(name: str) -> str:
    return _REF.format(model=name)


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}
