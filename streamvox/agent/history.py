"""Conversation history for the thinker, cut to a context budget."""

from __future__ import annotations

from collections.abc import Callable

# ChatML-style framing costs a few tokens a message.
MESSAGE_OVERHEAD_TOKENS = 4


def truncate_history(messages: list[dict], budget_tokens: int, count: Callable[[str], int]) -> list[dict]:
    """Keep the system messages and the newest turns that fit in `budget_tokens`.

    Turns are dropped oldest first. The newest message is always kept (cut from its start when it alone is
    over the budget), so the thinker always sees what it is answering.
    """
    system = [m for m in messages if m["role"] == "system"]
    turns = [m for m in messages if m["role"] != "system"]
    used = sum(count(m["content"]) + MESSAGE_OVERHEAD_TOKENS for m in system)
    kept: list[dict] = []
    for message in reversed(turns):
        cost = count(message["content"]) + MESSAGE_OVERHEAD_TOKENS
        if used + cost > budget_tokens:
            if not kept:  # the newest message alone is too long: keep its tail
                room = max(1, budget_tokens - used - MESSAGE_OVERHEAD_TOKENS)
                text = message["content"]
                while len(text) > 1 and count(text) > room:
                    text = text[len(text) // 4 or 1:]
                kept.append({**message, "content": text})
            break
        kept.append(message)
        used += cost
    kept.reverse()
    # A history must not start with an assistant turn answering a dropped user turn.
    while len(kept) > 1 and kept[0]["role"] == "assistant":
        kept.pop(0)
    return system + kept
