// A WebSocket that reconnects with backoff. The owner decides, per close, whether to
// reconnect (see protocol.closeAction) and builds a fresh URL for every attempt, which
// is how a stream adds its resume token after the first connection.

import { backoffDelay } from './protocol.js';

export const SocketState = Object.freeze({
  IDLE: 'idle',
  CONNECTING: 'connecting',
  OPEN: 'open',
  WAITING: 'waiting', // closed, a reconnect is scheduled
  CLOSED: 'closed', // closed for good (done, fatal, or stopped by us)
});

export class ReconnectingSocket {
  /**
   * @param {object} o
   * @param {() => string} o.url              URL for the next attempt
   * @param {(code: number, reason: string) => string} o.onClose  returns an action of
   *        protocol.closeAction: 'done' | 'fatal' | 'resume' | 'fresh' | 'wait'
   * @param {(data: string|ArrayBuffer) => void} o.onMessage
   * @param {() => void} [o.onOpen]
   * @param {(s: {state: string, attempt: number, delayMs?: number, code?: number,
   *              reason?: string, action?: string}) => void} [o.onState]
   * @param {object} [o.backoff]  {base, max, factor} in ms
   * @param {number} [o.healthyAfterMs]  an open socket this old resets the backoff
   * @param {() => Promise<string[]|undefined>} [o.protocols]  subprotocols for the next
   *        attempt (a fresh meeting token each time); a failure counts as a failed attempt
   */
  constructor({ url, onClose, onMessage, onOpen = () => {}, onState = () => {},
    backoff = {}, healthyAfterMs = 10000, WebSocketImpl = globalThis.WebSocket, protocols = null }) {
    Object.assign(this, { url, onClose, onMessage, onOpen, onState, backoff, healthyAfterMs, protocols });
    this.WebSocketImpl = WebSocketImpl;
    this.ws = null;
    this.state = SocketState.IDLE;
    this.attempt = 0; // failed attempts since the last healthy connection
    this.connects = 0; // successful opens, all time
    this.timer = null;
    this.healthyTimer = null;
  }

  start() {
    if (this.state !== SocketState.IDLE && this.state !== SocketState.WAITING) return;
    clearTimeout(this.timer);
    this.#connect();
  }

  /** Connect now instead of waiting out the backoff. */
  retryNow() {
    if (this.state === SocketState.WAITING) this.start();
  }

  /** The connection proved itself (e.g. `session.started`): reset the backoff. */
  markHealthy() {
    this.attempt = 0;
  }

  get isOpen() {
    return this.ws?.readyState === 1;
  }

  get bufferedAmount() {
    return this.ws?.bufferedAmount ?? 0;
  }

  send(data) {
    if (!this.isOpen) return false;
    this.ws.send(data);
    return true;
  }

  /** Close for good: no reconnect. */
  stop(code = 1000, reason = '') {
    clearTimeout(this.timer);
    clearTimeout(this.healthyTimer);
    const ws = this.ws;
    this.ws = null;
    this.#setState({ state: SocketState.CLOSED, code, reason, action: 'done' });
    if (ws && ws.readyState <= 1) {
      ws.onclose = null;
      ws.onmessage = null;
      ws.close(code, reason);
    }
  }

  #setState(s) {
    this.state = s.state;
    this.onState({ attempt: this.attempt, ...s });
  }

  #connect() {
    this.#setState({ state: SocketState.CONNECTING });
    if (!this.protocols) {
      this.#open(undefined);
      return;
    }
    Promise.resolve().then(() => this.protocols()).then(
      (protocols) => { if (this.state === SocketState.CONNECTING && !this.ws) this.#open(protocols); },
      (err) => { if (this.state === SocketState.CONNECTING && !this.ws) this.#retry(0, String(err), 'resume'); },
    );
  }

  #open(protocols) {
    let ws;
    try {
      ws = protocols ? new this.WebSocketImpl(this.url(), protocols) : new this.WebSocketImpl(this.url());
    } catch (err) {
      // A malformed URL is not going to get better.
      this.#setState({ state: SocketState.CLOSED, code: 0, reason: String(err), action: 'fatal' });
      return;
    }
    ws.binaryType = 'arraybuffer';
    this.ws = ws;
    ws.onopen = () => {
      this.connects += 1;
      this.#setState({ state: SocketState.OPEN });
      clearTimeout(this.healthyTimer);
      this.healthyTimer = setTimeout(() => this.markHealthy(), this.healthyAfterMs);
      this.onOpen();
    };
    ws.onmessage = (ev) => this.onMessage(ev.data);
    ws.onerror = () => {}; // a close event always follows; handled there
    ws.onclose = (ev) => {
      clearTimeout(this.healthyTimer);
      if (this.ws !== ws) return;
      this.ws = null;
      const action = this.onClose(ev.code, ev.reason);
      if (action === 'done' || action === 'fatal') {
        this.#setState({ state: SocketState.CLOSED, code: ev.code, reason: ev.reason, action });
        return;
      }
      this.#retry(ev.code, ev.reason, action);
    };
  }

  #retry(code, reason, action) {
    const slow = action === 'wait' ? { base: 2000, max: 30000 } : {};
    const delayMs = backoffDelay(this.attempt, { ...this.backoff, ...slow });
    this.attempt += 1;
    this.#setState({ state: SocketState.WAITING, delayMs, code, reason, action });
    this.timer = setTimeout(() => this.#connect(), delayMs);
  }
}
