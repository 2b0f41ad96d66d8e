"""Cartesia's TTS API (`WS /tts/websocket`, `POST /tts/bytes`), so LiveKit's and Pipecat's Cartesia plugins
stream an LLM's text into a running generation and get word timings back (docs/cartesia.md)."""
