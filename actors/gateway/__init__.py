"""The HTTP gateway: sojourn's client API for systems that do not speak NATS, callback URLs
that deliver one signal to one run, and signed webhooks (docs/gateway.md)."""

from ._app import GatewayConfig, create_app
from ._auth import BearerTokens, Caller, Policy, parse_actions
from ._openapi import openapi_document
from ._server import GatewayServer
from ._webhooks import WebhookRoute, parse_route

__all__ = [
    "BearerTokens",
    "Caller",
    "GatewayConfig",
    "GatewayServer",
    "Policy",
    "WebhookRoute",
    "create_app",
    "openapi_document",
    "parse_actions",
    "parse_route",
]
