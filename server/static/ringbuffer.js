// A fixed-size ring of PCM16 samples addressed by absolute sample index.
//
// The stream keeps the last couple of minutes of what it captured here, so that after
// a reconnect it can re-send audio from wherever the server says it lost track
// (`session.started.resume_from`). Pure: no DOM.

export class PcmRing {
  /** @param {number} capacity samples kept (e.g. 120 s × 16 000) */
  constructor(capacity) {
    this.buf = new Int16Array(capacity);
    this.capacity = capacity;
    this.end = 0; // absolute index one past the newest sample
  }

  /** Absolute index of the oldest sample still held. */
  get start() {
    return Math.max(0, this.end - this.capacity);
  }

  /** Append samples (an Int16Array). */
  write(samples) {
    let src = samples;
    if (src.length > this.capacity) src = src.subarray(src.length - this.capacity);
    const skipped = samples.length - src.length;
    const at = (this.end + skipped) % this.capacity;
    const first = Math.min(src.length, this.capacity - at);
    this.buf.set(src.subarray(0, first), at);
    if (first < src.length) this.buf.set(src.subarray(first), 0);
    this.end += samples.length;
  }

  /**
   * Copy of samples [from, to), clamped to what is held.
   * @returns {Int16Array}
   */
  read(from, to = this.end) {
    const a = Math.max(from, this.start);
    const b = Math.min(to, this.end);
    if (b <= a) return new Int16Array(0);
    const out = new Int16Array(b - a);
    const i = a % this.capacity;
    const first = Math.min(out.length, this.capacity - i);
    out.set(this.buf.subarray(i, i + first));
    if (first < out.length) out.set(this.buf.subarray(0, out.length - first), first);
    return out;
  }
}

/**
 * Where a resumed stream re-sends from, in ring indices. The server wants audio again from
 * `resumeFrom` (seconds of the stream) and, when it names `sendFrom` (≤ resumeFrom), hears
 * the audio from there too: the left context of its next final, never transcribed again.
 * We send from the earliest of those the ring still holds; `from` is the second to name
 * in a `resend` message (null: send none, as before `send_from`), and `lost` the samples
 * after resumeFrom the ring no longer holds.
 * @returns {{start: number, from: number|null, lost: number}}
 */
export function resendPlan(ringStart, timelineOffset, resumeFrom, sendFrom, sampleRate) {
  const wanted = timelineOffset + Math.round(Number(resumeFrom || 0) * sampleRate);
  if (ringStart > wanted) return { start: ringStart, from: null, lost: ringStart - wanted };
  if (sendFrom === undefined || sendFrom === null) return { start: wanted, from: null, lost: 0 };
  const earliest = timelineOffset + Math.round(Math.min(Number(sendFrom), Number(resumeFrom)) * sampleRate);
  const start = Math.max(earliest, ringStart);
  return { start, from: (start - timelineOffset) / sampleRate, lost: 0 };
}
