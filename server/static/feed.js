// The meeting feed: the read-only listener socket that carries every source's
// transcript events. On connecting it first replays the meeting's finals after
// `after_seq` (all of them the first time), so a late joiner sees the whole meeting
// and a reconnect fills the gap.

import {
  closeAction, describeClose, eventsUrl, MessageType, socketProtocols, transcriptUrl,
} from './protocol.js';
import { ReconnectingSocket, SocketState } from './socket.js';

export const FeedPhase = Object.freeze({
  CONNECTING: 'connecting',
  LIVE: 'live',
  WAITING: 'waiting', // the meeting does not exist yet
  RECONNECTING: 'reconnecting',
  CLOSED: 'closed',
  FAILED: 'failed',
});

export class MeetingFeed {
  /**
   * @param {object} o
   * @param {string} o.base
   * @param {string} o.meetingId
   * @param {() => number} o.getLastSeq  highest seq already shown
   * @param {(msg: object, meta: {receivedAt: number}) => void} o.onTranscript
   * @param {(phase: string, detail: object) => void} o.onPhase
   * @param {(notice: object) => void} o.onNotice
   * @param {(scope: string) => Promise<string>} [o.token]  a meeting token per connection
   *        or transcript read, when the server requires authentication
   */
  constructor({ base, meetingId, getLastSeq, onTranscript, onPhase, onNotice, token = null }) {
    Object.assign(this, { base, meetingId, getLastSeq, onTranscript, onPhase, onNotice, token });
    this.everOpen = false;
    this.droppedAt = null;
    this.lastErrorCode = null;
    this.fullReplay = false; // next connection asks for every final (the log restarted)
    this.socket = new ReconnectingSocket({
      url: () => eventsUrl(this.base, {
        meetingId: this.meetingId,
        afterSeq: this.fullReplay ? null : this.getLastSeq(),
      }),
      onOpen: () => this.#onOpen(),
      onMessage: (data) => this.#onMessage(data),
      onClose: (code) => {
        const errorCode = this.lastErrorCode;
        this.lastErrorCode = null;
        return closeAction(code, { kind: 'events', errorCode });
      },
      onState: (s) => this.#onState(s),
      backoff: { base: 500, max: 10000 },
      protocols: token ? async () => socketProtocols(await token('events')) : null,
    });
  }

  start() {
    this.socket.start();
  }

  stop() {
    this.socket.stop(1000, 'left');
  }

  #onOpen() {
    const reconnect = this.everOpen && !this.fullReplay; // our own replay reconnect is quiet
    this.everOpen = true;
    this.fullReplay = false;
    this.onPhase(FeedPhase.LIVE, {});
    if (reconnect) {
      const now = performance.timeOrigin + performance.now();
      this.onNotice({ kind: 'reconnected', source: 'feed', at: now,
        downSeconds: this.droppedAt === null ? 0 : (now - this.droppedAt) / 1000 });
      this.#checkLogReset();
    }
    this.droppedAt = null;
  }

  /**
   * A server restarted with the in-process store has forgotten the meeting and numbers
   * finals from 1 again; `after_seq` (our highest seq) would then hide every new final
   * up to it. If the server's log ends below what we have shown, reconnect asking for
   * all of it.
   */
  async #checkLogReset() {
    const shown = this.getLastSeq();
    if (shown <= 0) return;
    let logged = 0;
    try {
      const url = new URL(transcriptUrl(this.base, this.meetingId, 'json'));
      if (this.token) url.searchParams.set('access_token', await this.token('transcript'));
      const res = await fetch(url);
      if (res.ok) {
        const body = await res.json();
        for (const f of body.finals ?? []) logged = Math.max(logged, Number(f.seq) || 0);
      } else if (res.status !== 404) {
        return;
      }
    } catch {
      return;
    }
    if (logged >= shown || !this.socket.isOpen) return;
    this.fullReplay = true;
    this.onNotice({ kind: 'log-reset', source: 'feed', at: Date.now() });
    this.socket.ws.close(4000, 'meeting log restarted; replaying');
  }

  #onMessage(data) {
    if (typeof data !== 'string') return;
    const receivedAt = performance.timeOrigin + performance.now();
    let msg;
    try { msg = JSON.parse(data); } catch { return; }
    if (msg.type === MessageType.PARTIAL || msg.type === MessageType.FINAL
      || msg.type === MessageType.SPEAKER) {
      this.socket.markHealthy();
      this.onTranscript(msg, { receivedAt });
    } else if (msg.type === MessageType.ERROR) {
      this.lastErrorCode = msg.code ?? null;
      // slow_consumer is routine (we reconnect and catch up); anything else is worth saying.
      if (msg.code !== 'slow_consumer') {
        this.onNotice({ kind: 'error', source: 'feed', at: receivedAt, message: msg.message, code: msg.code });
      }
    }
  }

  #onState(s) {
    if (s.state === SocketState.CONNECTING) {
      this.onPhase(this.everOpen ? FeedPhase.RECONNECTING : FeedPhase.CONNECTING, s);
    } else if (s.state === SocketState.WAITING) {
      if (s.action === 'wait') {
        this.onPhase(FeedPhase.WAITING, s);
        return;
      }
      if (this.droppedAt === null && this.everOpen && !this.fullReplay) {
        this.droppedAt = performance.timeOrigin + performance.now();
        this.onNotice({ kind: 'dropped', source: 'feed', at: this.droppedAt,
          reason: describeClose(s.code, s.reason) });
      }
      this.onPhase(FeedPhase.RECONNECTING, { ...s, reason: describeClose(s.code, s.reason) });
    } else if (s.state === SocketState.CLOSED) {
      this.onPhase(s.action === 'fatal' ? FeedPhase.FAILED : FeedPhase.CLOSED,
        { reason: describeClose(s.code, s.reason) });
    }
  }
}
