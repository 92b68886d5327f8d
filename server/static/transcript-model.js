// The meeting transcript as data: finals keyed by `seq` (gap-free per meeting), and the
// partials still being spoken keyed by `utterance_id`. Events can arrive twice (the
// stream socket and the listener socket both carry our own finals, and a reconnect may
// replay); applying them is idempotent.
//
// A server that lost its meeting log (restarted with the in-process store) numbers from
// 1 again: a known seq arriving with a different utterance_id starts a new "epoch", so
// those finals are shown after the old ones instead of being taken for duplicates.
// Pure: no DOM.

export class TranscriptModel {
  constructor() {
    this.finals = []; // sorted by (epoch, seq)
    this.byKey = new Map(); // `${epoch}:${seq}` → final
    this.finalUtterances = new Set();
    this.partials = new Map(); // utterance_id → partial
    this.epoch = 0;
  }

  /** Highest seq of the current epoch (what a listener resumes after), or -1. */
  get lastSeq() {
    let last = -1;
    for (let i = this.finals.length - 1; i >= 0 && this.finals[i].epoch === this.epoch; i--) {
      last = Math.max(last, this.finals[i].seq);
    }
    return last;
  }

  /**
   * Apply a `transcript.final`. Returns {final, isNew} or null when the message is not
   * usable. `final.order` sorts finals; `final.key` names one.
   * @param {object} msg  the server message
   * @param {{receivedAt?: number|null, latency?: number|null}} [extra]
   */
  addFinal(msg, extra = {}) {
    if (typeof msg?.text !== 'string') return null;
    const uid = msg.utterance_id ?? null;
    let seq = Number.isInteger(msg.seq) ? msg.seq : null;
    if (seq === null) {
      if (uid && this.finalUtterances.has(uid)) return this.#known(this.finals.find((f) => f.utterance_id === uid), extra);
      seq = this.lastSeq + 1;
    }
    const known = this.byKey.get(`${this.epoch}:${seq}`);
    if (known) {
      if (known.utterance_id === uid || !uid || !known.utterance_id) return this.#known(known, extra);
      if (this.finalUtterances.has(uid)) {
        return this.#known(this.finals.find((f) => f.utterance_id === uid), extra);
      }
      this.epoch += 1; // same number, different utterance: the server's log restarted
    } else if (uid && this.finalUtterances.has(uid)) {
      return this.#known(this.finals.find((f) => f.utterance_id === uid), extra);
    }
    const final = {
      epoch: this.epoch,
      seq,
      key: `${this.epoch}:${seq}`,
      order: this.epoch * 1e9 + seq,
      utterance_id: uid,
      participant: msg.participant ?? 'speaker',
      text: msg.text.trim(),
      start: Number(msg.start) || 0,
      end: Number(msg.end) || 0,
      language: msg.language ?? null,
      speaker: typeof msg.speaker === 'string' ? msg.speaker : null, // diarize=true sources
      words: Array.isArray(msg.words) ? msg.words : undefined,
      // The meeting's one clock (Unix s), when the server sends it: see export.onMeetingClock.
      wall_time: Number.isFinite(msg.wall_time?.start) && Number.isFinite(msg.wall_time?.end)
        ? { start: msg.wall_time.start, end: msg.wall_time.end } : undefined,
      timing: msg.timing ?? undefined,
      receivedAt: extra.receivedAt ?? null,
      latency: extra.latency ?? null,
    };
    this.byKey.set(final.key, final);
    if (uid) {
      this.finalUtterances.add(uid);
      this.partials.delete(uid);
    }
    let index = this.finals.length;
    while (index > 0 && this.finals[index - 1].order > final.order) index -= 1;
    this.finals.splice(index, 0, final);
    return { final, isNew: true };
  }

  /**
   * Apply a `transcript.speaker`: the final of that utterance now belongs to another
   * speaker. Returns the changed final, or null (unknown utterance, or no change).
   */
  setSpeaker(msg) {
    if (!msg?.utterance_id || typeof msg.speaker !== 'string') return null;
    const final = this.finals.find((f) => f.utterance_id === msg.utterance_id);
    if (!final || final.speaker === msg.speaker) return null;
    final.speaker = msg.speaker;
    return final;
  }

  /** Same final from the other socket: keep the first arrival, fill in latency. */
  #known(final, extra) {
    if (!final) return null;
    if (final.latency == null && extra.latency != null) final.latency = extra.latency;
    return { final, isNew: false };
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

  /**
   * Drop partials that will get no final: a source that vanished, or an utterance whose
   * final was empty (the server sends none). Returns their ids.
   *   participant: only this source's;  olderThan: not updated since (ms);
   *   endedBy: ended before this time on the source's timeline — a source speaks its
   *            utterances one after another, so once a later one shows up, earlier
   *            partials are done.
   */
  dropPartials({ participant = null, olderThan = null, endedBy = null, except = null } = {}) {
    const dropped = [];
    for (const [id, p] of this.partials) {
      if (id === except) continue;
      if ((participant === null || p.participant === participant)
        && (olderThan === null || p.updatedAt < olderThan)
        && (endedBy === null || p.end <= endedBy)) {
        this.partials.delete(id);
        dropped.push(id);
      }
    }
    return dropped;
  }

  /** Partials of msg's source that ended before msg's utterance began (see dropPartials). */
  supersededBy(msg) {
    return this.dropPartials({
      participant: msg.participant ?? 'speaker',
      endedBy: (Number(msg.start) || 0) + 0.01,
      except: msg.utterance_id,
    });
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
