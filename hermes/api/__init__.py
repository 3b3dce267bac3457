"""``hermes serve``: the HTTP API over :class:`hermes.client.HermesClient`.

    app = create_app(get_settings())        # an ASGI app; `hermes serve` runs it with uvicorn

Routes (OpenAPI 3.1 at ``GET /openapi.json``): ``GET /health``; ``POST/GET /v1/sessions``;
``GET /v1/sessions/{id}``; ``POST /v1/sessions/{id}/messages`` (``Idempotency-Key`` names the
message; a retry attaches to its turn: :mod:`hermes.api.retries`); ``GET /v1/sessions/{id}/transcript``; ``POST /v1/sessions/{id}/close``;
``GET /v1/approvals``; ``POST /v1/sessions/{id}/approvals/{tool_call_id}/approve|reject``;
``GET /v1/memory?q=``, ``GET /v1/memory/list``, ``DELETE /v1/memory``.

Identities come from API keys (:mod:`hermes.api.keys`); errors are RFC 9457 problem
documents (:mod:`hermes.api.problems`).
"""

from __future__ import annotations

from hermes.api.app import OPERATIONS, create_app, openapi_document
from hermes.api.keys import Identity, KeyRing, add_key

__all__ = ["OPERATIONS", "Identity", "KeyRing", "add_key", "create_app", "openapi_document"]
