// AudioWorklet processor: mono input at the context's rate → anti-aliased 16 kHz PCM16
// frames posted to the main thread, plus a level reading every 50 ms.
//
// Runs on the audio rendering thread: no allocation per render quantum beyond what the
// resampler returns, no DOM. The main thread sends {type: 'flush'} at the end of a
// replay to get the last partial frame and the filter's tail.

import { Resampler } from './resampler.js';

const TARGET_RATE = 16000;

class ParleyCaptureProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const frameMs = options?.processorOptions?.frameMs ?? 40;
    this.frameSamples = Math.round((TARGET_RATE * frameMs) / 1000);
    this.resampler = new Resampler(sampleRate, TARGET_RATE); // `sampleRate`: worklet global
    this.frame = new Int16Array(this.frameSamples);
    this.fill = 0;
    this.levelWindow = Math.round(sampleRate * 0.05);
    this.levelCount = 0;
    this.sumSquares = 0;
    this.peak = 0;
    this.alive = true;
    this.port.onmessage = (event) => {
      const type = event.data?.type;
      if (type === 'flush') {
        this.push(this.resampler.flush());
        this.postFrame(this.fill);
        this.port.postMessage({ type: 'flushed' });
      } else if (type === 'close') {
        this.alive = false;
      }
    };
    this.port.postMessage({ type: 'ready', inputRate: sampleRate, outputRate: TARGET_RATE,
      taps: this.resampler.K ?? 1, frameSamples: this.frameSamples });
  }

  postFrame(length) {
    if (length === 0) return;
    const samples = this.frame.slice(0, length);
    this.port.postMessage({ type: 'frame', samples }, [samples.buffer]);
    this.fill = 0;
  }

  push(floats) {
    for (let i = 0; i < floats.length; i++) {
      const s = Math.max(-1, Math.min(1, floats[i]));
      this.frame[this.fill++] = Math.round(s < 0 ? s * 32768 : s * 32767);
      if (this.fill === this.frameSamples) this.postFrame(this.fill);
    }
  }

  process(inputs) {
    const channels = inputs[0];
    if (!channels || channels.length === 0) return this.alive; // nothing connected right now
    const mono = channels[0]; // the node's input is explicitly mono (browser down-mixes)
    for (let i = 0; i < mono.length; i++) {
      const s = mono[i];
      this.sumSquares += s * s;
      const a = Math.abs(s);
      if (a > this.peak) this.peak = a;
    }
    this.levelCount += mono.length;
    if (this.levelCount >= this.levelWindow) {
      this.port.postMessage({
        type: 'level', rms: Math.sqrt(this.sumSquares / this.levelCount), peak: this.peak,
      });
      this.levelCount = 0;
      this.sumSquares = 0;
      this.peak = 0;
    }
    this.push(this.resampler.process(mono));
    return this.alive;
  }
}

registerProcessor('parley-capture', ParleyCaptureProcessor);
