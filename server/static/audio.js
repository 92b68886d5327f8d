// Audio sources for a stream: the microphone, or a decoded file played at real time.
// Both go through the same AudioWorklet (capture-worklet.js), which hands back 16 kHz
// PCM16 frames and level readings.

const WORKLET_URL = new URL('./capture-worklet.js', import.meta.url);
export const FRAME_MS = 40;

function newContext() {
  const Ctx = globalThis.AudioContext ?? globalThis.webkitAudioContext;
  if (!Ctx) throw new Error('This browser has no Web Audio support.');
  return new Ctx({ latencyHint: 'interactive' });
}

/** The worklet node, its mono input, and a silent path to the destination so it runs. */
async function captureNode(ctx, { onFrame, onLevel }) {
  await ctx.audioWorklet.addModule(WORKLET_URL);
  const node = new AudioWorkletNode(ctx, 'parley-capture', {
    numberOfInputs: 1,
    numberOfOutputs: 1,
    outputChannelCount: [1],
    channelCount: 1,
    channelCountMode: 'explicit',
    channelInterpretation: 'speakers',
    processorOptions: { frameMs: FRAME_MS },
  });
  let flushed = null;
  node.port.onmessage = (event) => {
    const msg = event.data;
    if (msg.type === 'frame') onFrame(msg.samples);
    else if (msg.type === 'level') onLevel?.(msg.rms, msg.peak);
    else if (msg.type === 'flushed') flushed?.();
    else if (msg.type === 'ready') node.info = msg;
  };
  const sink = new GainNode(ctx, { gain: 0 });
  node.connect(sink).connect(ctx.destination);
  node.flush = () => new Promise((resolve) => {
    flushed = resolve;
    node.port.postMessage({ type: 'flush' });
  });
  node.close = () => {
    node.port.postMessage({ type: 'close' });
    node.disconnect();
    sink.disconnect();
  };
  return node;
}

/**
 * Open the microphone. Returns {setMuted, stop, info, track}.
 * Echo cancellation stays on (people listen to the meeting on speakers); noise
 * suppression and gain control are left to the browser's defaults for speech.
 */
export async function openMicrophone({ onFrame, onLevel, onEnded }) {
  if (!navigator.mediaDevices?.getUserMedia) {
    throw new Error('This page needs a secure context (https or localhost) to use the microphone.');
  }
  const ctx = newContext();
  let stream;
  try {
    stream = await navigator.mediaDevices.getUserMedia({
      audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true, autoGainControl: true },
      video: false,
    });
  } catch (err) {
    await ctx.close();
    throw err;
  }
  const node = await captureNode(ctx, { onFrame, onLevel });
  const source = new MediaStreamAudioSourceNode(ctx, { mediaStream: stream });
  source.connect(node);
  await ctx.resume();
  const [track] = stream.getAudioTracks();
  let stopped = null;
  track.addEventListener('ended', () => onEnded?.());
  return {
    track,
    get info() { return { ...node.info, label: track.label, contextRate: ctx.sampleRate }; },
    /** Muted audio is sent as silence, so the stream's clock keeps pace with the wall. */
    setMuted(muted) { track.enabled = !muted; },
    /** Resolves once the last frame was handed over; the context closes after that. */
    stop() {
      stopped ??= (async () => {
        source.disconnect();
        for (const t of stream.getTracks()) t.stop();
        await node.flush();
        node.close();
        ctx.close().catch(() => {});
      })();
      return stopped;
    },
  };
}

/** Decode a file (anything the browser can play) into an AudioBuffer. */
export async function decodeFile(file) {
  const bytes = await file.arrayBuffer();
  const ctx = newContext();
  try {
    return await ctx.decodeAudioData(bytes);
  } finally {
    await ctx.close();
  }
}

/**
 * Play a decoded file through the capture worklet at real time: the audio clock paces
 * the stream exactly as a microphone would. Returns {stop, position, duration}.
 * onEnded runs after the last frame (including the filter's tail) was handed over.
 */
export async function playBuffer(buffer, { onFrame, onLevel, onEnded, monitor = false }) {
  const ctx = newContext();
  const node = await captureNode(ctx, { onFrame, onLevel });
  const source = new AudioBufferSourceNode(ctx, { buffer });
  source.connect(node);
  if (monitor) source.connect(ctx.destination);
  await ctx.resume();
  let startedAt = null;
  let finished = null;
  const finish = (completed) => {
    finished ??= (async () => {
      source.disconnect();
      await node.flush();
      onEnded?.(completed); // the stream can send `stop` now; closing the context can wait
      node.close();
      ctx.close().catch(() => {});
    })();
    return finished;
  };
  source.onended = () => finish(true);
  source.start();
  startedAt = ctx.currentTime;
  return {
    duration: buffer.duration,
    get position() {
      return finished ? buffer.duration : Math.min(buffer.duration, ctx.currentTime - startedAt);
    },
    stop() {
      source.onended = null;
      try { source.stop(); } catch { /* already stopped */ }
      return finish(false);
    },
  };
}
