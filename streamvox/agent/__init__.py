"""Voice-agent stages around the talker: the thinker (an LLM) and the speech recogniser (ASR).

Both are optional. `Responder` bundles what a server was started with; the realtime route asks it for a reply
to a conversation (a stream of text deltas) and for the transcript of a committed audio turn.
"""
