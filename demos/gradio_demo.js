// Browser side of demos/gradio_app.py. Audio never passes through Gradio: the page talks to the
// StreamVox server directly (WS /v1/audio/speech/stream and WS /v1/realtime) and plays the PCM
// deltas through the same AudioWorklet player as /demo (StreamVox.Player, jitter buffer).
// window.SVX_CONFIG = {serverUrl, apiKey, model, jitterMs} is set by the app; state is on window.streamvox.
(function () {
  "use strict";
  const config = window.SVX_CONFIG;
  const state = window.streamvox = {streamConnected: false, realtimeConnected: false, utterances: 0,
                                    responses: 0, timing: null, player: null, errors: [], lastStatus: null};
  let player = null;
  let stream = null;     // StreamVox.TextStreamClient
  let realtime = null;   // StreamVox.RealtimeClient
  let sent = "";         // text of the open utterance already sent (stream-as-you-type)
  let configured = null; // the session.config last sent

  const $ = (id) => document.getElementById(id);
  const set = (id, text) => { const el = $(id); if (el) el.textContent = text; };
  const ms = (v) => (v === null || v === undefined ? "-" : v.toFixed(0) + " ms");

  function renderStats() {
    const s = player.stats;
    set("svx-samples", s.streamReceived + " / " + s.streamPlayed);
    set("svx-buffered", (s.buffered / 24).toFixed(0) + " ms (" + s.state + ")");
    set("svx-underruns", s.underruns + " (waits for typed text: " + s.waits + ")");
    set("svx-context", s.contextState);
  }

  function renderTiming(t) {
    state.timing = t;
    set("svx-ttfp", ms(t.ttfpMs));
    set("svx-playstart", ms(t.playbackStartMs));
    set("svx-rtf", t.rtf === null ? "-" : t.rtf.toFixed(3));
    set("svx-duration", t.audioSeconds.toFixed(2) + " s");
    set("svx-status", t.status);
  }

  async function ensurePlayer() {
    if (!player) {
      player = new StreamVox.Player({sampleRate: 24000, jitterMs: config.jitterMs, onStats: renderStats});
      state.player = player.stats; window.streamvoxPlayer = player;
    }
    await player.init();
  }

  function onEvent(event) {
    if (event.type === "error") { state.errors.push(event.error || event); set("svx-status", "error: " + JSON.stringify(event.error || event.message)); }
    if (event.type === "audio.done") { state.utterances += 1; state.lastStatus = event.reason; }
    if (event.type === "audio.done" && event.reason === "cancelled") set("svx-status", "cancelled");
    if (event.type === "response.done") { state.responses += 1; state.lastStatus = event.response.status; }
    if (event.type === "close") {
      if (stream && stream.ws && stream.ws.readyState !== WebSocket.OPEN) { stream = null; state.streamConnected = false; configured = null; sent = ""; }
      if (realtime && realtime.ws && realtime.ws.readyState !== WebSocket.OPEN) { realtime = null; state.realtimeConnected = false; }
      set("svx-connection", "closed (" + event.code + ")");
    }
  }

  async function ensureStream() {
    await ensurePlayer();
    if (!stream) {
      const client = new StreamVox.TextStreamClient({baseUrl: config.serverUrl, apiKey: config.apiKey, player,
                                                      onEvent, onTiming: renderTiming});
      await client.connect();
      stream = client; state.streamConnected = true;
      set("svx-connection", "connected: /v1/audio/speech/stream");
    }
    return stream;
  }

  async function ensureRealtime() {
    await ensurePlayer();
    if (!realtime) {
      const client = new StreamVox.RealtimeClient({baseUrl: config.serverUrl, apiKey: config.apiKey,
                                                    model: config.model, player, onEvent, onTiming: renderTiming});
      await client.connect();
      realtime = client; state.realtimeConnected = true;
      set("svx-connection", "connected: /v1/realtime");
    }
    return realtime;
  }

  function configure(client, voice, speed, refAudio, refText) {
    const cfg = {voice: voice || undefined, speed: Number(speed) || 1.0};
    if (refAudio) { cfg.ref_audio = refAudio; if (refText) cfg.ref_text = refText; }
    const key = JSON.stringify(cfg);
    if (key !== configured && !client.open) { client.configure(cfg); configured = key; }
  }

  async function run(fn) {
    try { await fn(); } catch (e) { set("svx-connection", "failed: " + e.message); state.errors.push(String(e)); }
  }

  window.svxDemo = {
    // Speak button of the text-stream tab: send what is not sent yet, then input.done.
    speak(text, voice, speed, refAudio, refText) {
      return run(async () => {
        const client = await ensureStream();
        if (!client.open) { sent = ""; configure(client, voice, speed, refAudio, refText); }
        const rest = text.startsWith(sent) ? text.slice(sent.length) : text;
        if (rest) client.text(rest);
        client.done(); sent = "";
      });
    },
    // Each edit of the text box when "stream as I type" is on: send the newly completed words.
    typed(text, voice, speed, enabled, refAudio, refText) {
      if (!enabled) return;
      return run(async () => {
        const client = await ensureStream();
        if (!text.startsWith(sent)) return; // an edit before the sent part: wait for Speak
        const cut = Math.max(text.lastIndexOf(" "), text.lastIndexOf("\n")) + 1;
        if (cut <= sent.length) return;
        if (!client.open) configure(client, voice, speed, refAudio, refText);
        client.text(text.slice(sent.length, cut)); sent = text.slice(0, cut);
      });
    },
    stop() { if (stream) { stream.cancel(); sent = ""; } if (realtime) realtime.cancel(); },
    speakRealtime(text, voice) {
      return run(async () => {
        const client = await ensureRealtime();
        if (voice) client.updateSession(voice);
        client.speak(text);
      });
    },
    connect() { return run(ensureStream); },
  };
})();
