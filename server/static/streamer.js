// One audio source in a meeting: the stream socket, a ring buffer of what was captured,
// resume after a drop, and the latency of our own finals.
//
// Sample positions: the ring counts every captured 16 kHz sample from 0 ("ring
// index"). The server counts samples on the stream's timeline ("stream position",
// what `start`/`end` measure). timelineOffset maps one onto the other and moves only
// when the server starts a new timeline (a fresh session rather than a resume).

import { closeAction, Control, describeClose, MessageType, SAMPLE_RATE, streamUrl } from './protocol.js';
import { PcmRing, resendPlan } from './ringbuffer.js';
import { ReconnectingSocket, SocketState } from './socket.js';

const MIN_CHUNK = SAMPLE_RATE / 50; // 20 ms: never send a smaller frame unless flushing
const MAX_CHUNK = SAMPLE_RATE / 10; // 100 ms: catch-up after a reconnect goes in these
const HIGH_WATER_BYTES = 512 * 1024; // stop pumping while the socket has this much queued
const KEEPALIVE_MS = 5000;

export const StreamPhase = Object.freeze({
  CONNECTING: 'connecting', // first connection
  LIVE: 'live',
  RECONNECTING: 'reconnecting',
  FINISHING: 'finishing', // stop sent, waiting for the last finals
  ENDED: 'ended',
  FAILED: 'failed',
});

const wallNow = () => performance.timeOrigin + performance.now();

export class AudioStream {
  /**
   * @param {object} o
   * @param {string} o.base          page URL the socket path resolves against
   * @param {string} o.meetingId
   * @param {string} o.participant
   * @param {string} [o.language]
   * @param {number} [o.ringSeconds] audio kept for re-sending after a drop
   * @param {(phase: string, detail: object) => void} o.onPhase
   * @param {(msg: object, meta: {receivedAt: number, latency: number|null}) => void} o.onTranscript
   * @param {(notice: object) => void} o.onNotice
   * @param {() => Promise<string[]|undefined>} [o.protocols]  per connection: the meeting
   *        token's subprotocols when the server requires authentication
   */
  constructor({ base, meetingId, participant, language = 'en', diarize = false, ringSeconds = 120,
    onPhase, onTranscript, onNotice, getLastSeq = () => -1, protocols = null }) {
    Object.assign(this, { base, meetingId, participant, language, diarize, onPhase, onTranscript, onNotice, getLastSeq });
    this.ring = new PcmRing(ringSeconds * SAMPLE_RATE);
    this.phase = StreamPhase.CONNECTING;
    this.sessionId = null;
    this.startedLastSeq = 0; // the meeting's highest seq when our session (re)started
    this.resumeToken = null;
    this.attemptUsedToken = false;
    this.timelineOffset = 0; // ring index of stream position 0
    this.sentTo = null; // ring index sent up to, on the current connection (null: not started)
    this.ackedEnd = 0; // stream seconds covered by our finals on this timeline
    this.sendLog = []; // [streamPosEnd, wallMs] per frame sent, ascending
    this.finishing = false;
    this.stopSent = false;
    this.ended = false;
    this.droppedAt = null;
    this.lastErrorCode = null; // `code` of the last `error` message (explains the close)
    this.reconnects = 0;
    this.lastSendAt = 0;
    this.pumpTimer = null;
    this.socket = new ReconnectingSocket({
      url: () => this.#url(),
      onOpen: () => {},
      onMessage: (data) => this.#onMessage(data),
      onClose: (code, reason) => this.#onClose(code, reason),
      onState: (s) => this.#onSocketState(s),
      protocols,
    });
    this.keepalive = setInterval(() => {
      if (this.socket.isOpen && this.sentTo !== null && wallNow() - this.lastSendAt > KEEPALIVE_MS) {
        this.socket.send(JSON.stringify({ type: Control.KEEPALIVE }));
        this.lastSendAt = wallNow();
      }
    }, KEEPALIVE_MS);
  }

  start() {
    this.socket.start();
  }

  /** A frame of captured audio (Int16Array at 16 kHz). */
  pushFrame(samples) {
    if (this.ended) return;
    this.ring.write(samples);
    this.#pump();
  }

  /** No more audio: send what is left, then `stop`, and wait for the last finals. */
  finish() {
    if (this.ended || this.finishing) return;
    this.finishing = true;
    this.#setPhase(StreamPhase.FINISHING);
    this.#pump();
  }

  /** Ask the server to finalise the current utterance now. */
  finalize() {
    this.socket.send(JSON.stringify({ type: Control.FINALIZE }));
  }

  /** Close at once without waiting for finals. */
  abort() {
    this.#end(StreamPhase.ENDED, { reason: 'closed' });
    this.socket.stop(1000, 'client left');
  }

  get streamSeconds() {
    return this.sentTo === null ? 0 : (this.sentTo - this.timelineOffset) / SAMPLE_RATE;
  }

  #url() {
    this.attemptUsedToken = Boolean(this.resumeToken);
    return streamUrl(this.base, {
      meetingId: this.meetingId,
      participant: this.participant,
      language: this.language,
      diarize: this.diarize,
      resume: this.resumeToken ? { token: this.resumeToken, lastSeq: this.getLastSeq() } : null,
    });
  }

  #setPhase(phase, detail = {}) {
    this.phase = phase;
    this.onPhase(phase, { reconnects: this.reconnects, ...detail });
  }

  #end(phase, detail) {
    if (this.ended) return;
    this.ended = true;
    clearInterval(this.keepalive);
    clearTimeout(this.pumpTimer);
    this.#setPhase(phase, detail);
  }

  #onSocketState(s) {
    if (this.ended) return;
    if (s.state === SocketState.WAITING) {
      this.sentTo = null;
      this.stopSent = false;
      if (this.droppedAt === null) {
        this.droppedAt = wallNow();
        this.onNotice({ kind: 'dropped', source: 'stream', at: this.droppedAt, code: s.code,
          reason: describeClose(s.code, s.reason) });
      }
      this.#setPhase(StreamPhase.RECONNECTING, { delayMs: s.delayMs, attempt: s.attempt,
        reason: describeClose(s.code, s.reason) });
    } else if (s.state === SocketState.CLOSED && s.action === 'fatal') {
      this.#end(StreamPhase.FAILED, { reason: describeClose(s.code, s.reason) });
    } else if (s.state === SocketState.CLOSED && s.action === 'done') {
      this.#end(StreamPhase.ENDED, { reason: describeClose(s.code, s.reason) });
    }
  }

  #onClose(code, reason) {
    const stopping = this.stopSent && code === 1000;
    const action = closeAction(code, {
      kind: 'stream', resuming: this.attemptUsedToken, stopping, errorCode: this.lastErrorCode,
    });
    this.lastErrorCode = null;
    if (action === 'fresh') this.resumeToken = null;
    // A normal close we did not ask for (no `stop`): the server ended the session, so
    // come back as a new source rather than lose the microphone.
    if (action === 'done' && !this.stopSent && !this.finishing) {
      this.resumeToken = null;
      return 'fresh';
    }
    return action;
  }

  #onMessage(data) {
    const receivedAt = wallNow();
    if (typeof data !== 'string') return; // the server sends no binary frames
    let msg;
    try { msg = JSON.parse(data); } catch { return; }
    switch (msg.type) {
      case MessageType.SESSION_STARTED:
        this.#onStarted(msg, receivedAt);
        break;
      case MessageType.PARTIAL:
      case MessageType.SPEAKER:
        this.onTranscript(msg, { receivedAt, latency: null });
        break;
      case MessageType.FINAL: {
        this.ackedEnd = Math.max(this.ackedEnd, Number(msg.end) || 0);
        // A resumed stream first replays finals we missed (seq <= the meeting's last_seq
        // at session.started): their wait includes the outage, so no latency for them.
        const replayed = Number.isInteger(msg.seq) && msg.seq <= this.startedLastSeq;
        const latency = replayed ? null : this.#latencyOf(msg.end, receivedAt);
        this.onTranscript(msg, { receivedAt, latency });
        break;
      }
      case MessageType.ERROR:
        this.lastErrorCode = msg.code ?? null;
        // Transient ones (full, loading, restarting) show on the status pill instead.
        if (!['overloaded', 'shutting_down', 'slow_consumer'].includes(msg.code)) {
          this.onNotice({ kind: 'error', source: 'stream', at: receivedAt, code: msg.code, message: msg.message });
        }
        break;
      case MessageType.SESSION_ENDED:
        this.onNotice({ kind: 'ended', source: 'stream', at: receivedAt, summary: msg });
        if (this.finishing) {
          this.#end(StreamPhase.ENDED, { reason: 'finished', summary: msg });
          this.socket.stop(1000, 'done');
        }
        break;
      default:
        break; // vad.* and anything newer: not needed on screen
    }
  }

  #onStarted(msg, receivedAt) {
    const first = this.sessionId === null;
    const resumed = !first && this.attemptUsedToken
      && (msg.session_id === this.sessionId || Number(msg.resume_from) > 0);
    let resendFrom;
    let lostSeconds = 0;
    if (resumed) {
      // The server keeps this timeline and wants audio again from resume_from; with
      // send_from, from there (its next final's left context), if we say so first.
      const plan = resendPlan(this.ring.start, this.timelineOffset, msg.resume_from, msg.send_from, SAMPLE_RATE);
      resendFrom = plan.start;
      if (plan.lost > 0) {
        lostSeconds = plan.lost / SAMPLE_RATE;
        this.timelineOffset += plan.lost; // the server counts what we send next as resume_from
      }
      if (plan.from !== null) this.socket.send(JSON.stringify({ type: Control.RESEND, from: plan.from }));
      const keepBelow = resendFrom - this.timelineOffset;
      this.sendLog = this.sendLog.filter(([pos]) => pos <= keepBelow);
    } else {
      // A new timeline starting at zero. Re-send what no final of ours covered yet, so
      // words spoken around the drop still reach the server (at worst twice, never lost).
      const wanted = this.timelineOffset + Math.round(this.ackedEnd * SAMPLE_RATE);
      resendFrom = first ? this.ring.start : Math.max(wanted, this.ring.start);
      if (!first && resendFrom > wanted) lostSeconds = (resendFrom - wanted) / SAMPLE_RATE;
      this.timelineOffset = resendFrom;
      this.ackedEnd = 0;
      this.sendLog = [];
    }
    this.sessionId = msg.session_id ?? this.sessionId;
    this.startedLastSeq = Number.isInteger(msg.last_seq) ? msg.last_seq : 0;
    this.resumeToken = msg.resume_token || null;
    this.sentTo = resendFrom;
    this.socket.markHealthy();
    if (!first) {
      this.reconnects += 1;
      this.onNotice({
        kind: 'reconnected', source: 'stream', at: receivedAt, resumed,
        downSeconds: this.droppedAt === null ? 0 : (receivedAt - this.droppedAt) / 1000,
        resendSeconds: (this.ring.end - resendFrom) / SAMPLE_RATE,
        resumeFrom: resumed ? Number(msg.resume_from || 0) : 0,
        lostSeconds,
      });
    }
    this.droppedAt = null;
    this.#setPhase(this.finishing ? StreamPhase.FINISHING : StreamPhase.LIVE, {
      sessionId: this.sessionId, resumable: Boolean(this.resumeToken), config: msg.config,
    });
    this.#pump();
  }

  /** Protocol v1 latency: now − wall time at which the audio at `end` was sent. */
  #latencyOf(end, receivedAt) {
    const pos = Math.round(Number(end) * SAMPLE_RATE);
    for (const [sentPos, wall] of this.sendLog) {
      if (sentPos >= pos) return (receivedAt - wall) / 1000;
    }
    return null;
  }

  #pump() {
    clearTimeout(this.pumpTimer);
    if (this.sentTo === null || !this.socket.isOpen) return;
    while (this.sentTo < this.ring.end) {
      if (this.socket.bufferedAmount > HIGH_WATER_BYTES) {
        this.pumpTimer = setTimeout(() => this.#pump(), 50);
        return;
      }
      const available = this.ring.end - this.sentTo;
      if (available < MIN_CHUNK && !this.finishing) break;
      if (this.sentTo < this.ring.start) {
        // Overwritten while we were catching up (ring too small for the backlog).
        this.timelineOffset += this.ring.start - this.sentTo;
        this.sentTo = this.ring.start;
        continue;
      }
      const to = Math.min(this.ring.end, this.sentTo + MAX_CHUNK);
      const pcm = this.ring.read(this.sentTo, to);
      this.socket.send(pcm.buffer);
      this.sentTo = to;
      this.lastSendAt = wallNow();
      this.sendLog.push([to - this.timelineOffset, this.lastSendAt]);
    }
    if (this.sendLog.length > 20000) this.sendLog.splice(0, this.sendLog.length - 15000);
    if (this.finishing && !this.stopSent && this.sentTo >= this.ring.end) {
      this.socket.send(JSON.stringify({ type: Control.STOP }));
      this.stopSent = true;
    }
  }
}
