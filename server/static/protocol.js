// Wire protocol v1, client side. Mirrors the server's wire/ package (message types, close
// codes, id alphabet) and builds the socket URLs. Pure: usable from node's tests.

export const PROTOCOL_VERSION = 1;
export const SAMPLE_RATE = 16000;

/** Close codes the server uses (wire/codes.py CloseCode). */
export const CloseCode = Object.freeze({
  NORMAL: 1000,
  GOING_AWAY: 1001,
  UNSUPPORTED_DATA: 1003,
  NO_STATUS: 1005, // browser-side: closed without a code
  ABNORMAL: 1006, // browser-side: the connection dropped
  INVALID_PAYLOAD: 1007,
  POLICY_VIOLATION: 1008,
  MESSAGE_TOO_BIG: 1009,
  INTERNAL_ERROR: 1011,
  SERVICE_RESTART: 1012,
  TRY_AGAIN_LATER: 1013,
  BAD_REQUEST: 4400,
  UNAUTHORIZED: 4401,
  FORBIDDEN: 4403,
  NOT_FOUND: 4404,
  TIMEOUT: 4408,
  CONFLICT: 4409,
  MAX_DURATION: 4413, // the stream reached the server's time limit: reconnect to go on
  TOO_MANY_REQUESTS: 4429, // a quota (streams per key, listeners per meeting): retry later
});

export const MessageType = Object.freeze({
  SESSION_STARTED: 'session.started',
  SPEECH_STARTED: 'vad.speech_started',
  SPEECH_STOPPED: 'vad.speech_stopped',
  PARTIAL: 'transcript.partial',
  FINAL: 'transcript.final',
  SPEAKER: 'transcript.speaker', // a diarized final's speaker changed (diarize=true)
  ERROR: 'error',
  SESSION_ENDED: 'session.ended',
});

export const Control = Object.freeze({
  FINALIZE: 'finalize', STOP: 'stop', KEEPALIVE: 'keepalive', RESEND: 'resend',
});

/** Offered with a meeting token; the server selects it (browsers need one selected). */
export const SUBPROTOCOL = 'parley.v1';

/** WebSocket subprotocols carrying a meeting token (none without a token). */
export function socketProtocols(token) {
  return token ? [SUBPROTOCOL, `parley.token.${token}`] : undefined;
}

/**
 * A fresh single-use meeting token from the embedding application's backend, which
 * holds the API key and calls POST /v1/meetings/{id}/tokens for us. Its endpoint takes
 * `{meeting_id, scope}` (scope: stream | events | transcript) and answers `{token}`.
 */
export async function fetchToken(tokenUrl, meetingId, scope, fetchImpl = globalThis.fetch) {
  const res = await fetchImpl(tokenUrl, {
    method: 'POST',
    credentials: 'include',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ meeting_id: meetingId, scope }),
  });
  if (!res.ok) throw new Error(`token endpoint answered ${res.status}`);
  const { token } = await res.json();
  if (typeof token !== 'string' || !token) throw new Error('token endpoint gave no token');
  return token;
}

const ID_PATTERN = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$/;

/** Meeting ids and participant names share the server's safe alphabet. */
export function isValidId(value) {
  return typeof value === 'string' && ID_PATTERN.test(value);
}

/** Turn a display name ("Ada Lovelace") into a participant id ("Ada_Lovelace"). */
export function participantId(displayName) {
  const id = String(displayName)
    .normalize('NFKD')
    .replace(/[\u0300-\u036f]/g, '') // strip accents: "José" → "Jose"
    .trim()
    .replace(/\s+/g, '_')
    .replace(/[^A-Za-z0-9_.-]/g, '')
    .replace(/^[_.-]+/, '')
    .slice(0, 128);
  return id;
}

/** How a participant id reads on screen. */
export function displayName(participant) {
  return String(participant ?? '').replace(/_/g, ' ');
}

const WORDS_A = ['amber', 'brisk', 'calm', 'deft', 'eager', 'fair', 'grand', 'hazel', 'ivory',
  'jolly', 'keen', 'lucid', 'mellow', 'noble', 'olive', 'plucky', 'quiet', 'rapid', 'sunny',
  'tidy', 'urban', 'vivid', 'witty', 'young', 'zesty'];
const WORDS_B = ['otter', 'falcon', 'maple', 'harbor', 'comet', 'meadow', 'lantern', 'river',
  'summit', 'willow', 'beacon', 'canyon', 'delta', 'ember', 'fjord', 'glade', 'heron',
  'island', 'juniper', 'kestrel', 'lagoon', 'marble', 'nectar', 'orchid', 'pebble'];

/** A readable, hard-to-guess-by-accident meeting id: "calm-otter-4821". */
export function newMeetingId(random = Math.random) {
  const pick = (list) => list[Math.floor(random() * list.length)];
  const digits = String(Math.floor(random() * 10000)).padStart(4, '0');
  return `${pick(WORDS_A)}-${pick(WORDS_B)}-${digits}`;
}

/** http(s) base → ws(s) URL for a path relative to the page. */
export function socketUrl(relativePath, base) {
  const url = new URL(relativePath, base);
  url.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:';
  return url;
}

/**
 * The stream socket URL (one audio source).
 * resume: {token, lastSeq} when reconnecting to the same source.
 */
export function streamUrl(base, { meetingId, participant, language = 'en', diarize = false, resume = null }) {
  const url = socketUrl(`v1/meetings/${encodeURIComponent(meetingId)}/stream`, base);
  const q = url.searchParams;
  q.set('participant', participant);
  q.set('language', language);
  q.set('sample_rate', String(SAMPLE_RATE));
  q.set('encoding', 'pcm_s16le');
  q.set('interim_results', 'true');
  if (diarize) q.set('diarize', 'true'); // several voices on one source: label each
  if (resume?.token) {
    q.set('resume_token', resume.token);
    q.set('last_seq', String(Math.max(0, resume.lastSeq ?? 0))); // seqs start at 1
  }
  return url.toString();
}

/**
 * The listener socket URL (every source's transcript events, read-only). The server
 * first replays the meeting's finals with seq > after_seq, then streams live events.
 */
export function eventsUrl(base, { meetingId, afterSeq = null }) {
  const url = socketUrl(`v1/meetings/${encodeURIComponent(meetingId)}/events`, base);
  if (afterSeq !== null && afterSeq > 0) url.searchParams.set('after_seq', String(afterSeq));
  return url.toString();
}

/** REST transcript of the meeting, rendered by the server. */
export function transcriptUrl(base, meetingId, format = 'json') {
  const url = new URL(`v1/meetings/${encodeURIComponent(meetingId)}/transcript`, base);
  url.searchParams.set('format', format);
  return url.toString();
}

/**
 * What to do after a socket closed.
 *   'done'    — finished on purpose; do not reconnect
 *   'fatal'   — the request itself is wrong; reconnecting would fail the same way
 *   'resume'  — reconnect (with backoff) and resume the same source where supported
 *   'fresh'   — reconnect (with backoff) as a new source; the old session is gone
 *   'wait'    — the meeting does not exist (yet); keep retrying slowly (listener)
 */
export function closeAction(code, { kind = 'stream', resuming = false, stopping = false, errorCode = null } = {}) {
  // The `error` message before the close says more than the code: a slow reader
  // (1008 slow_consumer) or a full / restarting server can simply come back.
  if (['slow_consumer', 'overloaded', 'shutting_down', 'timeout', 'quota_exceeded',
    'max_duration'].includes(errorCode)) {
    return stopping && code === CloseCode.NORMAL ? 'done' : 'resume';
  }
  switch (code) {
    case CloseCode.NORMAL:
      return stopping || kind === 'stream' ? 'done' : 'resume';
    case CloseCode.POLICY_VIOLATION:
      // A listener only ever gets 1008 for falling behind: reconnect and catch up.
      return kind === 'events' ? 'resume' : 'fatal';
    case CloseCode.UNSUPPORTED_DATA:
    case CloseCode.INVALID_PAYLOAD:
    case CloseCode.MESSAGE_TOO_BIG:
    case CloseCode.BAD_REQUEST:
    case CloseCode.UNAUTHORIZED:
    case CloseCode.FORBIDDEN:
      return 'fatal';
    case CloseCode.INTERNAL_ERROR:
      return 'fresh';
    case CloseCode.CONFLICT:
      // Our source was resumed on another connection (another tab, or a half-open
      // socket we gave up on): coming back would only take it over again.
      return 'fatal';
    case CloseCode.NOT_FOUND:
      if (kind === 'events') return 'wait';
      return resuming ? 'fresh' : 'fatal';
    default:
      // 1001 going away, 1005/1006 dropped, 1012 restart, 1013 full, 4408 idle: try again.
      return stopping ? 'done' : 'resume';
  }
}

/** Human wording of a close, for the status line. */
export function describeClose(code, reason) {
  const names = {
    1000: 'closed', 1001: 'server going away', 1005: 'closed', 1006: 'connection lost',
    1007: 'invalid data', 1008: 'not allowed now', 1009: 'frame too large',
    1011: 'server error', 1012: 'server restarting', 1013: 'server is full',
    4400: 'bad request', 4401: 'not authorised', 4403: 'forbidden', 4404: 'not found',
    4408: 'idle timeout', 4409: 'resumed on another connection',
    4413: 'session time limit', 4429: 'too many connections',
  };
  const name = names[code] ?? `closed (${code})`;
  return reason ? `${name}: ${reason}` : name;
}

/**
 * Exponential backoff with jitter: attempt 0 → ~base, doubling up to max.
 * The delay lies in [d/2, d] so reconnecting clients spread out.
 */
export function backoffDelay(attempt, { base = 500, max = 15000, factor = 2 } = {}, random = Math.random) {
  const d = Math.min(max, base * factor ** Math.max(0, attempt));
  return Math.round(d / 2 + random() * (d / 2));
}
