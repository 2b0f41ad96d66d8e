"""A response's transcript word by word, with the session option `"streamvox": {"word_timestamps": true}`.

The response's engine request asks for word timings. Each word becomes one transcript delta, sent as its
timing arrives (after the audio it covers), with `start_time`: seconds from the response's first audio (the
field LiveKit's realtime plugin reads). A delta carries the space before its word, so the deltas concatenate to
the transcript. The transcript is what was spoken: the timed words, and, when the audio was complete, any
words left without a timing (an aligner that could not align the audio), in one last delta without
`start_time`.

`conversation.item.truncate` of such an item cuts its transcript after the last word that started before
`audio_end_ms` (`heard_transcript`), so the thinker's history holds the words the user heard and no others.
"""

from __future__ import annotations

from collections.abc import Callable

from streamvox.contract import WordTimings
from streamvox.server.realtime.conversation import Conversation
from streamvox.server.realtime.session import SessionState
from streamvox.server.word_timestamps import spoken_prefix


class WordDeltas:
    """One response's transcript deltas, one per spoken word.

    `text`: the engine request's whole input so far (the echo's text, or the thinker's deltas as fed); word
    timings index it. `ids`: the delta events' response, item, output and content ids.
    """

    def __init__(self, session: SessionState, ids: dict, text: Callable[[], str]) -> None:
        self.session = session
        self.ids = ids
        self.text = text
        self.transcript = ""
        self._parts: list[WordTimings] = []
        self._end = 0  # where the last word sent ends in `text`

    async def send(self, timings: WordTimings) -> None:
        """A delta for each word of `timings` (they follow the audio they cover, so they are sent at once)."""
        text, name = self.text(), self.session.event_name("transcript.delta")
        for i in range(len(timings)):
            delta = text[self._end if self.transcript else timings.char_start[i]:timings.char_end[i]]
            self._end = timings.char_end[i]
            self.transcript += delta
            await self.session.send(name, **self.ids, delta=delta, start_time=round(timings.start[i], 3))
        self._parts.append(timings)

    async def finish(self, audio_complete: bool) -> str:
        """The transcript, once the audio ended; with `audio_complete`, words that got no timing are sent first
        (in one delta without `start_time`)."""
        if audio_complete:
            rest = self.text()[self._end:].rstrip()
            if not self.transcript:
                rest = rest.lstrip()
            if rest:
                self.transcript += rest
                await self.session.send(self.session.event_name("transcript.delta"), **self.ids, delta=rest)
        return self.transcript

    def remember(self, conversation: Conversation, item_id: str) -> None:
        """Keep the item's text and timings for `conversation.item.truncate`."""
        timings = WordTimings.join(self._parts) if self._parts else WordTimings([], [], [], [], [])
        conversation.spoken[item_id] = (self.text(), timings)


def heard_transcript(conversation: Conversation, item_id: str, transcript: str, audio_end_ms: int,
                     audio_ms: int) -> str:
    """An assistant item's `transcript` once its audio is truncated at `audio_end_ms` (of the `audio_ms` it holds):
    "" as upstream, unless the item was spoken with word timings; then its words that started before
    `audio_end_ms` (the whole transcript when all of its audio was heard)."""
    spoken = conversation.spoken.get(item_id)
    if spoken is None:
        return ""
    if audio_end_ms >= audio_ms:
        return transcript
    text, timings = spoken
    return spoken_prefix(text, timings, audio_end_ms / 1000).strip()
