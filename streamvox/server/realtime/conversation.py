"""The session's conversation: its ordered items, and the validation of the items a client sends."""

from __future__ import annotations

from streamvox.contract import WordTimings
from streamvox.server.errors import APIError
from streamvox.server.realtime.protocol import item_text, new_id

MAX_CONVERSATION_ITEMS = 1000
MAX_STORED_AUDIO_CHARS = 64 * 1024 * 1024

_USER_CONTENT = {"input_text", "input_audio", "input_image"}
_ASSISTANT_CONTENT = {"output_text", "output_audio", "text", "audio"}


def _audio_chars(item: dict) -> int:
    return sum(len(part.get("audio") or "") for part in item.get("content") or [] if isinstance(part, dict))


def validate_item(item: object, param: str = "item") -> dict:
    """A client-sent conversation item -> its stored form (server-assigned id and status)."""
    if not isinstance(item, dict):
        raise APIError(400, f"'{param}' must be an object.", param=param, code="missing_required_parameter")
    item_id = item.get("id")
    if item_id is not None and (not isinstance(item_id, str) or not 0 < len(item_id) <= 64):
        raise APIError(400, f"'{param}.id' must be a string of 1 to 64 characters.", param=f"{param}.id")
    kind = item.get("type")
    stored: dict = {"id": item_id or new_id("item"), "object": "realtime.item", "type": kind, "status": "completed"}
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "assistant", "system"):
            raise APIError(400, f"'{param}.role' must be user, assistant or system.", param=f"{param}.role")
        content = item.get("content")
        if not isinstance(content, list):
            raise APIError(400, f"'{param}.content' must be a list.", param=f"{param}.content")
        allowed = _ASSISTANT_CONTENT if role == "assistant" else (
            {"input_text"} if role == "system" else _USER_CONTENT)
        parts = []
        for i, part in enumerate(content):
            where = f"{param}.content[{i}]"
            if not isinstance(part, dict) or not isinstance(part.get("type"), str) or part["type"] not in allowed:
                raise APIError(400, f"'{where}.type' must be one of {', '.join(sorted(allowed))} for a {role} "
                                    "message.", param=f"{where}.type")
            for key in ("text", "transcript", "audio", "image_url"):
                if part.get(key) is not None and not isinstance(part[key], str):
                    raise APIError(400, f"'{where}.{key}' must be a string.", param=f"{where}.{key}")
            if part["type"] in ("input_text", "output_text", "text") and not isinstance(part.get("text"), str):
                raise APIError(400, f"'{where}.text' is required.", param=f"{where}.text",
                               code="missing_required_parameter")
            parts.append({k: v for k, v in part.items() if k in ("type", "text", "transcript", "audio",
                                                                   "image_url", "detail")})
        stored.update(role=role, content=parts)
    elif kind == "function_call":
        for key in ("name", "arguments"):
            if not isinstance(item.get(key), str):
                raise APIError(400, f"'{param}.{key}' must be a string.", param=f"{param}.{key}")
        stored.update(name=item["name"], arguments=item["arguments"], call_id=item.get("call_id") or new_id("call"))
    elif kind == "function_call_output":
        for key in ("call_id", "output"):
            if not isinstance(item.get(key), str):
                raise APIError(400, f"'{param}.{key}' must be a string.", param=f"{param}.{key}")
        stored.update(call_id=item["call_id"], output=item["output"])
    else:
        raise APIError(400, f"'{param}.type' must be message, function_call or function_call_output.",
                       param=f"{param}.type")
    return stored


class Conversation:
    """The session's ordered items (the newest `MAX_CONVERSATION_ITEMS`)."""

    def __init__(self) -> None:
        self.id = new_id("conv")
        self.items: list[dict] = []
        self.audio_chars = 0
        self.audio_ms: dict[str, int] = {}  # assistant item id -> milliseconds of audio sent
        # assistant item id -> (the text its audio spoke, the words' timings in it), with word timestamps on
        self.spoken: dict[str, tuple[str, WordTimings]] = {}

    def index(self, item_id: str) -> int | None:
        for i, item in enumerate(self.items):
            if item["id"] == item_id:
                return i
        return None

    def get(self, item_id: object, param: str = "item_id") -> dict:
        index = self.index(item_id) if isinstance(item_id, str) else None
        if index is None:
            raise APIError(400, f"Conversation item {item_id!r} does not exist.", param=param, code="item_not_found")
        return self.items[index]

    def insert(self, item: dict, previous_item_id: object = None) -> str | None:
        """Add `item` after `previous_item_id` ("root": first; None: last); the id it now follows."""
        if self.index(item["id"]) is not None:
            raise APIError(400, f"An item with id '{item['id']}' already exists.", param="item.id",
                           code="duplicate_item_id")
        if self.audio_chars + _audio_chars(item) > MAX_STORED_AUDIO_CHARS:
            raise APIError(400, f"The conversation holds more than {MAX_STORED_AUDIO_CHARS} bytes of audio; "
                                "delete items first.", code="conversation_audio_limit")
        if previous_item_id is None:
            position = len(self.items)
        elif previous_item_id == "root":
            position = 0
        else:
            index = self.index(previous_item_id) if isinstance(previous_item_id, str) else None
            if index is None:
                raise APIError(400, f"previous_item_id {previous_item_id!r} does not exist.", param="previous_item_id",
                               code="item_not_found")
            position = index + 1
        self.items.insert(position, item)
        self.audio_chars += _audio_chars(item)
        while len(self.items) > MAX_CONVERSATION_ITEMS:
            self._forget(self.items.pop(0))
        index = self.index(item["id"])
        return self.items[index - 1]["id"] if index else None

    def replace(self, item: dict) -> None:
        if (index := self.index(item["id"])) is not None:
            self.items[index] = item

    def delete(self, item_id: object) -> None:
        item = self.get(item_id)
        self.items.remove(item)
        self._forget(item)

    def _forget(self, item: dict) -> None:
        self.audio_chars -= _audio_chars(item)
        self.audio_ms.pop(item["id"], None)
        self.spoken.pop(item["id"], None)

    def latest_user_text(self) -> str:
        for item in reversed(self.items):
            if item.get("role") == "user" and (text := item_text(item)):
                return text
        return ""

    def input_items(self, value: object, resolve: bool = True) -> list[dict] | None:
        """`response.input` -> its items, validated. Item references are looked up now, or with `resolve=False`
        checked now and left for `resolve` (when the response runs, with the items' content then); None when the
        response has no input of its own."""
        if value is None:
            return None
        if not isinstance(value, list):
            raise APIError(400, "'response.input' must be a list of items.", param="response.input")
        items = []
        for i, entry in enumerate(value):
            if not _is_reference(entry):
                entry = validate_item(entry, f"response.input[{i}]")
            else:
                found = self.get(entry.get("id"), f"response.input[{i}].id")
                entry = found if resolve else entry
            items.append(entry)
        return items

    def resolve(self, items: list[dict]) -> list[dict]:
        """`input_items(..., resolve=False)` with its item references looked up (those deleted since are left out)."""
        out = []
        for entry in items:
            if not _is_reference(entry):
                out.append(entry)
            elif (index := self.index(entry["id"])) is not None:
                out.append(self.items[index])
        return out


def _is_reference(entry: object) -> bool:
    return isinstance(entry, dict) and entry.get("type") == "item_reference"
