"""The server: HTTP, SSE and WebSocket protocols over the engine."""
