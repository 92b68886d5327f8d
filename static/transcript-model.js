// The meeting transcript as data: finals keyed by `seq` (gap-free per meeting), and the
// partials still being spoken keyed by `utterance_id`. Events can arrive twice (the
// stream socket and the listener socket both carry our own finals, and a reconnect may
// replay); applying them is idempotent. Pure: no DOM.

export class TranscriptModel {
  constructor() {
    this.finals = []; // sorted by seq
    this.bySeq = new Map();
    this.finalUtterances = new Set();
    this.partials = new Map(); // utterance_id → partial
  }

  get lastSeq() {
    return this.finals.length ? this.finals[this.finals.length - 1].seq : -1;
  }

  /**
   * Apply a `transcript.final`. Returns {final, isNew, index} — index is where it sits
   * in `finals` — or null when the message is not usable.
   * @param {object} msg  the server message
   * @param {{receivedAt?: number, latency?: number|null}} [extra]
   */
  addFinal(msg, extra = {}) {
    if (typeof msg?.text !== 'string') return null;
    const seq = Number.isInteger(msg.seq) ? msg.seq : null;
    const known = seq !== null ? this.bySeq.get(seq) : null;
    if (known) {
      // Same final from the other socket: keep the earliest arrival, fill in latency.
      if (known.latency == null && extra.latency != null) known.latency = extra.latency;
      return { final: known, isNew: false, index: this.finals.indexOf(known) };
    }
    if (seq === null && this.finalUtterances.has(msg.utterance_id)) return null;
    const final = {
      seq: seq ?? (this.lastSeq + 1),
      utterance_id: msg.utterance_id ?? null,
      participant: msg.participant ?? 'speaker',
      text: msg.text.trim(),
      start: Number(msg.start) || 0,
      end: Number(msg.end) || 0,
      language: msg.language ?? null,
      words: Array.isArray(msg.words) ? msg.words : undefined,
      timing: msg.timing ?? undefined,
      receivedAt: extra.receivedAt ?? null,
      latency: extra.latency ?? null,
    };
    this.bySeq.set(final.seq, final);
    if (final.utterance_id) {
      this.finalUtterances.add(final.utterance_id);
      this.partials.delete(final.utterance_id);
    }
    let index = this.finals.length;
    while (index > 0 && this.finals[index - 1].seq > final.seq) index -= 1;
    this.finals.splice(index, 0, final);
    return { final, isNew: true, index };
  }

  /** Apply a `transcript.partial`; null if its utterance is already final. */
  setPartial(msg, now = Date.now()) {
    if (!msg?.utterance_id || this.finalUtterances.has(msg.utterance_id)) return null;
    const partial = {
      utterance_id: msg.utterance_id,
      participant: msg.participant ?? 'speaker',
      text: String(msg.text ?? '').trim(),
      start: Number(msg.start) || 0,
      end: Number(msg.end) || 0,
      updatedAt: now,
    };
    this.partials.set(partial.utterance_id, partial);
    return partial;
  }

  /** Drop partials nobody finalised (a source that vanished). Returns their ids. */
  dropPartials({ participant = null, olderThan = null } = {}) {
    const dropped = [];
    for (const [id, p] of this.partials) {
      if ((participant === null || p.participant === participant)
        && (olderThan === null || p.updatedAt < olderThan)) {
        this.partials.delete(id);
        dropped.push(id);
      }
    }
    return dropped;
  }

  /** Highest `end` among this participant's finals (its stream timeline), or 0. */
  lastEndOf(participant) {
    let end = 0;
    for (const f of this.finals) if (f.participant === participant) end = Math.max(end, f.end);
    return end;
  }

  /** Latency statistics over the finals that have a measurement. */
  latencyStats() {
    const xs = this.finals.map((f) => f.latency).filter((x) => x != null).sort((a, b) => a - b);
    if (!xs.length) return null;
    const q = (p) => xs[Math.min(xs.length - 1, Math.floor(p * xs.length))];
    const last = [...this.finals].reverse().find((f) => f.latency != null).latency;
    return { n: xs.length, last, median: q(0.5), p95: q(0.95), max: xs[xs.length - 1] };
  }
}
