// The /demo page: connect to /v1/realtime, speak a phrase, show live timing and player counters.
// Tests read window.streamvox (see tests/test_demo_browser.py).
(function () {
  "use strict";
  const $ = (id) => document.getElementById(id);
  const params = new URLSearchParams(location.search);
  const apiKey = params.get("api_key") || "";
  const jitterMs = Number(params.get("jitter_ms") || 150);
  $("jitter-ms").textContent = jitterMs;

  const state = window.streamvox = {
    connected: false, sessionId: null, responses: 0, lastStatus: null, errors: [], events: 0,
    timing: null, player: null,
  };
  const player = new StreamVox.Player({sampleRate: 24000, jitterMs, onStats: render});
  state.player = player.stats;
  window.streamvoxPlayer = player;
  let client = null;

  function log(line) {
    const el = $("log");
    el.textContent = (line + "\n" + el.textContent).slice(0, 20000);
  }
  const ms = (v) => (v === null || v === undefined ? "-" : v.toFixed(0) + " ms");

  function render() {
    const s = player.stats;
    $("samples").textContent = s.streamReceived + " / " + s.streamPlayed + "  (total " + s.received + " / " + s.played + ")";
    $("buffered").textContent = (s.buffered / 24).toFixed(0) + " ms (" + s.state + ")";
    $("underruns").textContent = s.underruns;
    $("ctxstate").textContent = s.contextState;
    $("stop").disabled = !(client && (client.running || s.state !== "idle")); // stop the response or the playback
  }

  function renderTiming(t) {
    state.timing = t;
    $("ttfp").textContent = ms(t.ttfpMs);
    $("playstart").textContent = ms(t.playbackStartMs);
    $("rtf").textContent = t.rtf === null ? "-" : t.rtf.toFixed(3);
    $("duration").textContent = t.audioSeconds.toFixed(2) + " s";
    $("rstatus").textContent = t.status;
  }

  async function voices() {
    const headers = apiKey ? {Authorization: "Bearer " + apiKey} : {};
    const body = await (await fetch("/v1/audio/voices", {headers})).json();
    const select = $("voice");
    select.innerHTML = "";
    for (const v of body.voices) {
      const opt = document.createElement("option");
      opt.value = opt.textContent = v;
      select.appendChild(opt);
    }
    select.value = body.voices.includes("alloy") ? "alloy" : body.default_voice;
  }

  $("connect").onclick = async () => {
    $("connect").disabled = true;
    $("status").textContent = "connecting";
    try {
      await player.init(); // inside the click: the AudioContext may start
      render();
      client = new StreamVox.RealtimeClient({
        baseUrl: location.href, apiKey, model: params.get("model") || "", player,
        onTiming: (t) => { renderTiming(t); },
        onEvent: (event) => {
          state.events += 1;
          if (event.type !== "response.output_audio.delta") log(JSON.stringify(event).slice(0, 300));
          if (event.type === "error") state.errors.push(event.error);
          if (event.type === "response.done") {
            state.responses += 1; state.lastStatus = event.response.status;
          }
          if (event.type === "close") {
            if (state.connected) $("status").textContent = "closed (" + event.code + ")";
            state.connected = false;
            $("speak").disabled = true; $("connect").disabled = false;
          }
        },
      });
      const created = await client.connect();
      await voices().catch((e) => log("voices: " + e));
      state.connected = true; state.sessionId = created.session.id;
      $("status").textContent = "connected";
      $("speak").disabled = false; $("voice").disabled = false;
    } catch (e) {
      $("status").textContent = "failed: " + e.message;
      $("connect").disabled = false;
    }
  };

  $("speak").onclick = async () => {
    await player.init();
    client.updateSession($("voice").value);
    client.speak($("text").value);
    $("stop").disabled = false;
  };
  $("stop").onclick = () => client.cancel();
})();
