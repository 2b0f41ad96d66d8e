// StreamVox browser client: a low-latency PCM16 player (AudioWorklet + jitter buffer) and thin
// clients for WS /v1/realtime (OpenAI Realtime, GA dialect) and WS /v1/audio/speech/stream.
// Plain script, no build step; defines window.StreamVox. Used by /demo and by demos/gradio_app.py.
(function () {
  "use strict";

  // The worklet runs on the audio thread. It holds a FIFO of Float32 chunks and starts (or, after an
  // underrun, resumes) playing only once `jitterSamples` are queued or the stream has ended.
  // An underrun is counted when the FIFO runs dry after the jitter buffer filled and before the end,
  // while the server had all of the text; running dry while the text is still coming in (typed or
  // streamed by the client, "input open") is a wait for input, counted apart as `waits`.
  const WORKLET_SOURCE = `
class StreamVoxProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    this.jitter = options.processorOptions.jitterSamples;
    this.queue = []; this.offset = 0; this.buffered = 0;
    this.state = "idle"; this.ended = false; this.filled = false; this.inputOpen = false; this.waits = 0;
    this.accepting = true; // false after "clear" (barge-in) until the next "begin": late audio is dropped
    this.received = 0; this.played = 0; this.underruns = 0; this.underrunSamples = 0;
    this.streamReceived = 0; this.streamPlayed = 0; this.blocks = 0; this.stream = 0;
    this.port.onmessage = (e) => this.onMessage(e.data);
  }
  onMessage(m) {
    if (m.type === "begin") {
      this.queue = []; this.offset = 0; this.buffered = 0; this.ended = false; this.filled = false;
      this.state = "buffering"; this.streamReceived = 0; this.streamPlayed = 0; this.stream = m.stream;
      this.inputOpen = false; this.accepting = true;
    } else if (m.type === "input") {
      this.inputOpen = m.open;
    } else if (m.type === "audio") {
      if (!this.accepting) return;
      if (this.state === "idle") this.state = "buffering";
      this.queue.push(m.samples); this.buffered += m.samples.length;
      this.received += m.samples.length; this.streamReceived += m.samples.length;
    } else if (m.type === "end") {
      this.ended = true;
      if (this.buffered === 0 && this.state !== "idle") this.finish();
    } else if (m.type === "clear") {
      this.queue = []; this.offset = 0; this.buffered = 0; this.ended = true; this.state = "idle";
      this.accepting = false;
    }
    this.report();
  }
  finish() { this.state = "idle"; this.report("drained"); }
  report(event) {
    this.port.postMessage({type: event || "stats", stream: this.stream, state: this.state, filled: this.filled,
      received: this.received, played: this.played, underruns: this.underruns, underrunSamples: this.underrunSamples,
      waits: this.waits,
      streamReceived: this.streamReceived, streamPlayed: this.streamPlayed, buffered: this.buffered});
  }
  process(inputs, outputs) {
    const out = outputs[0][0];
    const n = out.length;
    if (this.state === "buffering" && (this.buffered >= this.jitter || (this.ended && this.buffered > 0))) {
      this.state = "playing";
      if (!this.filled) { this.filled = true; this.report("started"); }
    }
    let i = 0;
    if (this.state === "playing") {
      while (i < n && this.queue.length) {
        const chunk = this.queue[0];
        const take = Math.min(n - i, chunk.length - this.offset);
        out.set(chunk.subarray(this.offset, this.offset + take), i);
        i += take; this.offset += take; this.buffered -= take;
        if (this.offset === chunk.length) { this.queue.shift(); this.offset = 0; }
      }
      this.played += i; this.streamPlayed += i;
      if (i < n) {
        if (this.ended) this.finish();
        else if (this.inputOpen) { this.waits += 1; this.state = "buffering"; this.report("wait"); }
        else { this.underruns += 1; this.underrunSamples += n - i; this.state = "buffering"; this.report("underrun"); }
      }
    }
    if (i < n) out.fill(0, i);
    if (++this.blocks % 8 === 0) this.report();
    return true;
  }
}
registerProcessor("streamvox-player", StreamVoxProcessor);
`;

  function base64ToBytes(b64) {
    const bin = atob(b64);
    const bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    return bytes;
  }

  function bytesToBase64(bytes) {
    let bin = "";
    for (let i = 0; i < bytes.length; i += 0x8000) bin += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
    return btoa(bin);
  }

  class Player {
    constructor(options = {}) {
      this.sampleRate = options.sampleRate || 24000;
      this.jitterMs = options.jitterMs === undefined ? 150 : options.jitterMs;
      this.onStats = options.onStats || (() => {});
      this.context = null;
      this.node = null;
      this.stream = 0;
      this.startedStream = -1; // the last stream whose playback start was reported
      this.carry = null; // an odd trailing byte of a PCM16 delta
      this.stats = {received: 0, played: 0, underruns: 0, underrunSamples: 0, waits: 0,
                    streamReceived: 0, streamPlayed: 0, buffered: 0, state: "idle", filled: false, started: 0, drained: 0, contextState: "none",
                    streamBytes: 0, streamHash: 0x811c9dc5, streamChunks: 0};
    }

    // Call from a user gesture (a click) so the AudioContext may start.
    async init() {
      if (this.context) { await this.context.resume(); return; }
      this.context = new AudioContext({sampleRate: this.sampleRate, latencyHint: "interactive"});
      this.context.onstatechange = () => { this.stats.contextState = this.context.state; this.onStats(this.stats); };
      const url = URL.createObjectURL(new Blob([WORKLET_SOURCE], {type: "application/javascript"}));
      await this.context.audioWorklet.addModule(url);
      URL.revokeObjectURL(url);
      this.node = new AudioWorkletNode(this.context, "streamvox-player", {
        numberOfInputs: 0, numberOfOutputs: 1, outputChannelCount: [1],
        processorOptions: {jitterSamples: Math.round(this.sampleRate * this.jitterMs / 1000)},
      });
      this.node.port.onmessage = (e) => this.onMessage(e.data);
      this.node.connect(this.context.destination);
      await this.context.resume();
      this.stats.contextState = this.context.state;
    }

    onMessage(m) {
      const s = this.stats;
      for (const k of ["received", "played", "underruns", "underrunSamples", "waits", "buffered", "state", "filled"]) {
        s[k] = m[k];
      }
      if (m.stream === this.stream) { s.streamReceived = m.streamReceived; s.streamPlayed = m.streamPlayed; }
      if (m.type === "started") s.started += 1;
      // Playback of the current stream began: the "started" report, or any report that finds it
      // playing (messages from the worklet can be coalesced or overtaken under load).
      if (m.stream === this.stream && (m.type === "started" || m.state === "playing") && this.startedStream !== this.stream) {
        this.startedStream = this.stream;
        if (this.onStarted) this.onStarted(m);
      }
      if (m.type === "drained") { s.drained += 1; if (this.onDrained) this.onDrained(m); }
      s.contextState = this.context.state;
      this.onStats(s);
    }

    begin() {
      this.stream += 1; this.carry = null;
      this.stats.streamReceived = 0; this.stats.streamPlayed = 0;
      this.stats.streamBytes = 0; this.stats.streamHash = 0x811c9dc5; this.stats.streamChunks = 0;
      this.node.port.postMessage({type: "begin", stream: this.stream});
    }

    // PCM16 little-endian mono (ArrayBuffer or Uint8Array); returns the number of samples queued.
    pushPCM16(data) {
      let bytes = data instanceof Uint8Array ? data : new Uint8Array(data);
      // FNV-1a (32 bit) of the stream's bytes, so tests can compare what arrived with a reference.
      let hash = this.stats.streamHash;
      for (let i = 0; i < bytes.length; i++) hash = Math.imul(hash ^ bytes[i], 0x01000193) >>> 0;
      this.stats.streamHash = hash; this.stats.streamBytes += bytes.length; this.stats.streamChunks += 1;
      if (this.carry !== null) {
        const joined = new Uint8Array(bytes.length + 1);
        joined[0] = this.carry; joined.set(bytes, 1); bytes = joined; this.carry = null;
      }
      if (bytes.length % 2) { this.carry = bytes[bytes.length - 1]; bytes = bytes.subarray(0, bytes.length - 1); }
      const n = bytes.length / 2;
      if (!n) return 0;
      const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.length);
      const samples = new Float32Array(n);
      for (let i = 0; i < n; i++) samples[i] = view.getInt16(2 * i, true) / 32768;
      this.node.port.postMessage({type: "audio", samples}, [samples.buffer]);
      return n;
    }

    pushBase64(b64) { return this.pushPCM16(base64ToBytes(b64)); }
    // While the client is still sending the stream's text, running dry counts as a wait, not an underrun.
    inputOpen(open) { this.node.port.postMessage({type: "input", open}); }
    end() { this.node.port.postMessage({type: "end"}); }
    clear() { this.node.port.postMessage({type: "clear"}); }
  }

  // Record when playback of the current response/utterance began and publish it: the whole response
  // may have arrived (and its last snapshot been sent) before the jitter buffer started playing.
  function markPlaybackStart(client) {
    if (!client.timing) return;
    client.timing.playStart = performance.now();
    client.onTiming(client.timing.snapshot());
  }

  // Timing of one response/utterance: TTFP from the request to the first audio delta, RTF as
  // (time until the latest delta) / (audio received), and the audio's duration.
  class Timing {
    constructor(sampleRate) { this.sampleRate = sampleRate; this.reset(); }
    reset() {
      this.t0 = performance.now(); this.first = null; this.last = null; this.playStart = null;
      this.samples = 0; this.done = false; this.status = "running";
    }
    delta(samples) {
      const now = performance.now();
      if (this.first === null) this.first = now;
      this.last = now; this.samples += samples;
    }
    snapshot() {
      const audio = this.samples / this.sampleRate;
      const end = this.done ? this.last : performance.now();
      return {
        ttfpMs: this.first === null ? null : this.first - this.t0,
        playbackStartMs: this.playStart === null ? null : this.playStart - this.t0,
        audioSeconds: audio,
        rtf: audio > 0 && end !== null ? (end - this.t0) / 1000 / audio : null,
        status: this.status,
      };
    }
  }

  function wsUrl(base, path, params) {
    const url = new URL(path, base);
    url.protocol = url.protocol === "https:" ? "wss:" : url.protocol === "http:" ? "ws:" : url.protocol;
    for (const [k, v] of Object.entries(params || {})) if (v) url.searchParams.set(k, v);
    return url.toString();
  }

  function subprotocols(apiKey, withRealtime) {
    const list = withRealtime ? ["realtime"] : [];
    if (apiKey) list.push("openai-insecure-api-key." + apiKey);
    return list;
  }

  // WS /v1/realtime, GA dialect. The server's responder speaks the user's text back.
  class RealtimeClient {
    constructor({baseUrl, apiKey, model, player, onEvent, onTiming}) {
      Object.assign(this, {baseUrl, apiKey, model, player});
      this.onEvent = onEvent || (() => {});
      this.onTiming = onTiming || (() => {});
      this.timing = null; this.ws = null; this.responseId = null; this.responses = 0; this.running = false;
    }
    connect() {
      return new Promise((resolve, reject) => {
        const ws = new WebSocket(wsUrl(this.baseUrl, "/v1/realtime", {model: this.model}),
                                 subprotocols(this.apiKey, true));
        this.ws = ws;
        ws.onmessage = (e) => {
          const event = JSON.parse(e.data);
          if (event.type === "session.created") resolve(event);
          this.handle(event);
        };
        ws.onerror = () => reject(new Error("WebSocket error"));
        ws.onclose = (e) => { reject(new Error("closed " + e.code)); this.onEvent({type: "close", code: e.code}); };
      });
    }
    send(event) { this.ws.send(JSON.stringify(event)); }
    updateSession(voice) {
      this.send({type: "session.update", session: {type: "realtime", output_modalities: ["audio"],
                 audio: {output: {format: {type: "audio/pcm", rate: this.player.sampleRate}, voice}}}});
    }
    speak(text) {
      this.timing = new Timing(this.player.sampleRate);
      this.player.begin();
      this.player.onStarted = () => markPlaybackStart(this);
      this.send({type: "conversation.item.create",
                 item: {type: "message", role: "user", content: [{type: "input_text", text}]}});
      this.send({type: "response.create"});
      this.running = true; this.cancelled = false;
    }
    // Barge-in: stop the running response and drop the audio not played yet.
    cancel() {
      if (this.running) this.send({type: "response.cancel"});
      this.cancelled = true; // deltas still in flight are dropped
      this.player.clear();
    }
    handle(event) {
      if (event.type === "response.created") { this.responseId = event.response.id; }
      else if (event.type === "response.output_audio.delta") {
        if (this.cancelled) return this.onEvent(event);
        const n = this.player.pushBase64(event.delta);
        if (this.timing) { this.timing.delta(n); this.onTiming(this.timing.snapshot()); }
      } else if (event.type === "response.done") {
        if (!this.cancelled) this.player.end();
        this.responses += 1; this.running = false;
        if (this.timing) {
          this.timing.done = true; this.timing.status = event.response.status;
          this.onTiming(this.timing.snapshot());
        }
      }
      this.onEvent(event);
    }
    close() { if (this.ws) this.ws.close(1000); }
  }

  // WS /v1/audio/speech/stream: JSON control frames in; audio.start, binary PCM16, audio.done out.
  class TextStreamClient {
    constructor({baseUrl, apiKey, player, onEvent, onTiming}) {
      Object.assign(this, {baseUrl, apiKey, player});
      this.onEvent = onEvent || (() => {});
      this.onTiming = onTiming || (() => {});
      this.timing = null; this.ws = null; this.open = false; this.utterances = 0;
      // Utterances are numbered from 0 in the order they are opened; after a cancel, audio of
      // utterances opened before it (still in flight) is dropped.
      this.opened = 0; this.dropBelow = 0; this.current = -1;
    }
    connect() {
      return new Promise((resolve, reject) => {
        const ws = new WebSocket(wsUrl(this.baseUrl, "/v1/audio/speech/stream"), subprotocols(this.apiKey, false));
        ws.binaryType = "arraybuffer";
        this.ws = ws;
        ws.onopen = () => resolve();
        ws.onmessage = (e) => {
          if (typeof e.data !== "string") {
            if (this.current < this.dropBelow) return;
            const n = this.player.pushPCM16(e.data);
            if (this.timing) { this.timing.delta(n); this.onTiming(this.timing.snapshot()); }
            return;
          }
          const event = JSON.parse(e.data);
          if (event.type === "audio.start") this.current = event.utterance_index;
          if (event.type === "audio.done" && event.utterance_index >= this.dropBelow) {
            this.player.end(); this.utterances += 1;
            if (this.timing) {
              this.timing.done = true; this.timing.status = event.reason;
              this.onTiming(this.timing.snapshot());
            }
          }
          this.onEvent(event);
        };
        ws.onerror = () => reject(new Error("WebSocket error"));
        ws.onclose = (e) => { reject(new Error("closed " + e.code)); this.onEvent({type: "close", code: e.code}); };
      });
    }
    send(event) { this.ws.send(JSON.stringify(event)); }
    configure(config) { this.send({type: "session.config", response_format: "pcm",
                                   sample_rate: this.player.sampleRate, ...config}); }
    // Text for the open utterance; the first call of an utterance starts its clock and playback.
    text(text) {
      if (!this.open) {
        this.open = true;
        this.timing = new Timing(this.player.sampleRate);
        this.player.begin();
        this.player.onStarted = () => markPlaybackStart(this);
        this.player.inputOpen(true);
        this.opened += 1;
      }
      this.send({type: "input.text", text});
    }
    done() {
      if (this.open) { this.open = false; this.send({type: "input.done"}); this.player.inputOpen(false); }
    }
    // Barge-in: stop the open, running and queued utterances and drop their audio not played yet.
    cancel() {
      this.open = false; this.dropBelow = this.opened;
      this.send({type: "input.cancel"}); this.player.clear();
    }
    close() { if (this.ws) this.ws.close(1000); }
  }

  window.StreamVox = {Player, Timing, RealtimeClient, TextStreamClient, base64ToBytes, bytesToBase64};
})();
