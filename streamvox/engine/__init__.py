"""The engine: `AsyncEngine` on the event loop (client), and the core process it supervises."""
