// node --test static/tests/ : the resampler's anti-aliasing and streaming behaviour.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { Resampler, designPolyphase, floatToPcm16, resampleAll } from '../resampler.js';

function tone(freq, rate, seconds, amp = 0.5) {
  const n = Math.round(rate * seconds);
  const x = new Float32Array(n);
  for (let i = 0; i < n; i++) x[i] = amp * Math.sin((2 * Math.PI * freq * i) / rate);
  return x;
}

function rms(x, from = 0, to = x.length) {
  let s = 0;
  for (let i = from; i < to; i++) s += x[i] * x[i];
  return Math.sqrt(s / (to - from));
}

/** Output RMS over input RMS in dB, skipping the filter's warm-up at both ends. */
function gainDb(freq, inRate, outRate = 16000) {
  const x = tone(freq, inRate, 1.0);
  const y = resampleAll(x, inRate, outRate);
  const edge = Math.round(0.05 * outRate);
  return 20 * Math.log10(rms(y, edge, y.length - edge) / rms(x));
}

for (const inRate of [48000, 44100, 32000, 22050]) {
  test(`${inRate} Hz → 16 kHz keeps speech and stops aliases`, () => {
    for (const f of [100, 1000, 3000, 6500]) {
      const g = gainDb(f, inRate);
      assert.ok(Math.abs(g) < 0.1, `${f} Hz pass-band gain ${g.toFixed(3)} dB`);
    }
    // Above the new Nyquist: nearest-sample picking would fold these into 1-7 kHz.
    for (const f of [8500, 9000, 12000, 15000, 20000, inRate / 2 - 500]) {
      if (f >= inRate / 2) continue; // not representable at this input rate
      const g = gainDb(f, inRate);
      assert.ok(g < -70, `${f} Hz should be stopped, gain ${g.toFixed(1)} dB`);
    }
  });
}

test('16 kHz → 16 kHz is a copy', () => {
  const x = tone(440, 16000, 0.1);
  assert.deepEqual(resampleAll(x, 16000, 16000), x);
  assert.deepEqual(new Resampler(16000, 16000).process(x), x);
});

test('8 kHz → 16 kHz upsampling keeps the tone', () => {
  const g = gainDb(1000, 8000);
  assert.ok(Math.abs(g) < 0.1, `gain ${g}`);
});

test('output does not depend on how the input is chunked', () => {
  const x = tone(1234, 44100, 0.5);
  for (let i = 0; i < x.length; i++) x[i] += 0.1 * Math.sin(i * 0.37) * ((i * 7919) % 13) / 13;
  const oneShot = new Resampler(44100, 16000).process(x);
  const r = new Resampler(44100, 16000);
  const parts = [];
  let i = 0;
  let size = 1;
  while (i < x.length) {
    parts.push(r.process(x.subarray(i, i + size)));
    i += size;
    size = (size * 7 + 3) % 300 || 128; // 1, 10, 73, ... and render-quantum-sized chunks
  }
  const streamed = new Float32Array(parts.reduce((n, p) => n + p.length, 0));
  let off = 0;
  for (const p of parts) { streamed.set(p, off); off += p.length; }
  assert.equal(streamed.length, oneShot.length);
  for (let k = 0; k < streamed.length; k++) assert.equal(streamed[k], oneShot[k]);
});

test('output length matches the rate ratio', () => {
  for (const inRate of [48000, 44100]) {
    const r = new Resampler(inRate, 16000);
    let n = 0;
    for (let q = 0; q < 1000; q++) n += r.process(new Float32Array(128)).length;
    const expected = (128000 * 16000) / inRate;
    assert.ok(Math.abs(n - expected) <= 1, `${inRate}: ${n} vs ${expected}`);
  }
});

test('the filter is a real low-pass, not sample picking', () => {
  const { K, L, M } = designPolyphase(48000, 16000);
  assert.equal(L, 1);
  assert.equal(M, 3);
  assert.ok(K > 100, `taps per output ${K}`);
});

test('float to PCM16 clamps and scales', () => {
  assert.deepEqual(Array.from(floatToPcm16(Float32Array.of(0, 1, -1, 2, -2, 0.5))),
    [0, 32767, -32768, 32767, -32768, 16384]);
});
