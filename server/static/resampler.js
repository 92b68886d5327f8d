// Streaming rational resampler: polyphase FIR, Kaiser-windowed sinc low-pass.
//
// out/in = L/M after reducing by the gcd (48 kHz → 16 kHz: L=1, M=3; 44.1 kHz → 16 kHz:
// L=160, M=441). The prototype low-pass runs at in·L Hz; only the taps that meet a
// non-zero input sample are ever multiplied, so each output sample costs K taps.
// The cut-off sits below the lower Nyquist frequency so that nothing above it folds
// back into the speech band (the anti-aliasing that nearest-sample picking lacks).
//
// Pure: no DOM, no Web Audio. Used by the AudioWorklet (capture-worklet.js), by the
// replay path, and by node's test runner (static/tests/).

function gcd(a, b) {
  while (b) [a, b] = [b, a % b];
  return a;
}

// Zeroth-order modified Bessel function of the first kind (power series).
function besselI0(x) {
  let sum = 1;
  let term = 1;
  const q = (x * x) / 4;
  for (let k = 1; k < 64; k++) {
    term *= q / (k * k);
    sum += term;
    if (term < sum * 1e-12) break;
  }
  return sum;
}

/** Kaiser window β for a stop-band attenuation in dB (Kaiser's empirical formula). */
export function kaiserBeta(attenuationDb) {
  if (attenuationDb > 50) return 0.1102 * (attenuationDb - 8.7);
  if (attenuationDb >= 21) {
    return 0.5842 * (attenuationDb - 21) ** 0.4 + 0.07886 * (attenuationDb - 21);
  }
  return 0;
}

/**
 * Design the resampler's filter. Returns the polyphase table (L phases × K taps, flat,
 * phase-major) with each phase scaled so the DC gain is 1.
 *
 * transitionHz: width of the band between pass-band edge and stop-band edge; the
 * stop-band edge is the lower of the two Nyquist frequencies.
 */
export function designPolyphase(inRate, outRate, { attenuationDb = 80, transitionHz } = {}) {
  const g = gcd(inRate, outRate);
  const L = outRate / g;
  const M = inRate / g;
  const nyquist = Math.min(inRate, outRate) / 2;
  const transition = transitionHz ?? nyquist * 0.1; // 800 Hz for a 16 kHz target
  const stopEdge = nyquist;
  const cutoff = stopEdge - transition / 2; // -6 dB point, centre of the transition band
  // Kaiser's length estimate, expressed in taps at the input rate.
  const deltaOmega = (2 * Math.PI * transition) / inRate;
  const K = Math.max(8, Math.ceil((attenuationDb - 7.95) / (2.285 * deltaOmega)));
  const N = K * L; // prototype length at the high rate in·L
  const beta = kaiserBeta(attenuationDb);
  const i0Beta = besselI0(beta);
  const fc = cutoff / (inRate * L); // normalised to the high rate
  const centre = (N - 1) / 2;
  const proto = new Float64Array(N);
  for (let j = 0; j < N; j++) {
    const t = j - centre;
    const sinc = t === 0 ? 2 * fc : Math.sin(2 * Math.PI * fc * t) / (Math.PI * t);
    const r = (2 * j) / (N - 1) - 1;
    const w = besselI0(beta * Math.sqrt(Math.max(0, 1 - r * r))) / i0Beta;
    proto[j] = sinc * w;
  }
  // Phase p uses proto[p + k·L] against input x[base − k]. Normalise each phase to a
  // DC gain of exactly 1 (the zero-stuffing gain L folds into this).
  const table = new Float32Array(N);
  for (let p = 0; p < L; p++) {
    let sum = 0;
    for (let k = 0; k < K; k++) sum += proto[p + k * L];
    for (let k = 0; k < K; k++) table[p * K + k] = proto[p + k * L] / sum;
  }
  return { L, M, K, table, cutoff, delayInputSamples: centre / L };
}

export class Resampler {
  /**
   * @param {number} inRate  input sample rate, Hz (integer)
   * @param {number} outRate output sample rate, Hz (integer)
   * @param {{attenuationDb?: number, transitionHz?: number}} [options]
   */
  constructor(inRate, outRate, options = {}) {
    if (!Number.isInteger(inRate) || !Number.isInteger(outRate) || inRate <= 0 || outRate <= 0) {
      throw new RangeError(`sample rates must be positive integers, got ${inRate} → ${outRate}`);
    }
    this.inRate = inRate;
    this.outRate = outRate;
    this.passthrough = inRate === outRate;
    if (this.passthrough) return;
    const design = designPolyphase(inRate, outRate, options);
    Object.assign(this, design);
    // History of the last K−1 input samples, then room for new input.
    this.history = new Float32Array(this.K - 1);
    this.pos = this.K - 1; // index (in history+input) of the newest sample the next output uses
    this.phase = 0;
  }

  /** Filter delay in seconds (what the output lags the input by). */
  get delaySeconds() {
    return this.passthrough ? 0 : this.delayInputSamples / this.inRate;
  }

  /**
   * Feed input samples, get every output sample they complete. Chunk sizes are free:
   * the concatenated output does not depend on how the input was split.
   * @param {Float32Array} input
   * @returns {Float32Array}
   */
  process(input) {
    if (this.passthrough) return Float32Array.from(input);
    const { K, L, M, table } = this;
    const hLen = this.history.length;
    const x = new Float32Array(hLen + input.length);
    x.set(this.history);
    x.set(input, hLen);
    let pos = this.pos;
    let phase = this.phase;
    const maxOut = pos < x.length ? Math.ceil(((x.length - pos) * L) / M) + 1 : 0;
    const out = new Float32Array(maxOut);
    let n = 0;
    while (pos < x.length) {
      const off = phase * K;
      let acc = 0;
      for (let k = 0; k < K; k++) acc += table[off + k] * x[pos - k];
      out[n++] = acc;
      phase += M;
      pos += Math.floor(phase / L);
      phase %= L;
    }
    const keepFrom = x.length - hLen;
    this.history = x.slice(keepFrom);
    this.pos = pos - keepFrom;
    this.phase = phase;
    return out.subarray(0, n);
  }

  /** Push out the samples still inside the filter (feeds zeros for its delay). */
  flush() {
    if (this.passthrough) return new Float32Array(0);
    return this.process(new Float32Array(Math.ceil(this.delayInputSamples) + 1));
  }
}

/** One-shot resampling of a whole buffer (replay of a decoded file). */
export function resampleAll(input, inRate, outRate, options) {
  const r = new Resampler(inRate, outRate, options);
  if (r.passthrough) return Float32Array.from(input);
  const head = r.process(input);
  const tail = r.flush();
  // Drop the filter delay at the front so the output lines up with the input.
  const skip = Math.round(r.delaySeconds * outRate);
  const want = Math.round((input.length * outRate) / inRate);
  const all = new Float32Array(head.length + tail.length);
  all.set(head);
  all.set(tail, head.length);
  return all.slice(skip, skip + want);
}

/** Float [-1, 1] → PCM16 (clamped, rounded). */
export function floatToPcm16(input, out = new Int16Array(input.length)) {
  for (let i = 0; i < input.length; i++) {
    const s = Math.max(-1, Math.min(1, input[i]));
    out[i] = Math.round(s < 0 ? s * 32768 : s * 32767);
  }
  return out;
}
