"""The gateway's HTTP API as ppf's own programs call it (gatewayapi/client.py)."""

from gatewayapi.client import Answer, GatewayApi, GatewayError

__all__ = ["Answer", "GatewayApi", "GatewayError"]
