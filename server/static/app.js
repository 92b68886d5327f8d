// Parley browser client: wires the page together. The pieces live in their own
// modules — protocol.js (wire format), socket.js (reconnecting WebSocket), streamer.js
// (one audio source), feed.js (listener socket), audio.js + capture-worklet.js (mic and
// replay), transcript-model.js / transcript-view.js, export.js.

import { decodeFile, openMicrophone, playBuffer } from './audio.js';
import { FORMATS } from './export.js';
import { FeedPhase, MeetingFeed } from './feed.js';
import {
  displayName, fetchToken, isValidId, MessageType, newMeetingId, participantId, socketProtocols,
} from './protocol.js';
import { AudioStream, StreamPhase } from './streamer.js';
import { TranscriptModel } from './transcript-model.js';
import { TranscriptView } from './transcript-view.js';

const $ = (id) => document.getElementById(id);
const BASE = document.baseURI;
const NAME_KEY = 'parley.name';
// With authentication on, every connection needs a fresh single-use meeting token. The
// embedding application's backend mints them; `?token_url=` says where (docs/browser.md).
const TOKEN_URL = new URLSearchParams(location.search).get('token_url');

const ui = {
  join: $('join'), joinForm: $('join-form'), meetingId: $('meeting-id'), newMeeting: $('new-meeting'),
  yourName: $('your-name'), language: $('language'), joinWatch: $('join-watch'),
  meetingError: $('meeting-error'), nameError: $('name-error'),
  meeting: $('meeting'), meetingInfo: $('meeting-info'), meetingLabel: $('meeting-label'),
  feedStatus: $('feed-status'), streamStatus: $('stream-status'), latency: $('latency'),
  speakerName: $('speaker-name'), speakerError: $('speaker-error'),
  micStart: $('mic-start'), micMute: $('mic-mute'), micStop: $('mic-stop'),
  meterRow: $('meter-row'), meter: $('meter'), meterFill: $('meter-fill'), micHelp: $('mic-help'),
  micCard: $('mic-card'), replayCard: $('replay-card'),
  micDiarize: $('mic-diarize'), replayDiarize: $('replay-diarize'),
  replayFile: $('replay-file'), replayMonitor: $('replay-monitor'), replayStart: $('replay-start'),
  replayStop: $('replay-stop'), replayRow: $('replay-row'), replayProgress: $('replay-progress'),
  replayStatus: $('replay-status'), shareLink: $('share-link'), copyLink: $('copy-link'),
  copyStatus: $('copy-status'), leave: $('leave'),
};

const state = {
  meetingId: null,
  language: 'en',
  model: new TranscriptModel(),
  view: new TranscriptView($('transcript'), { jumpButton: $('jump-latest'), empty: $('transcript-empty') }),
  feed: null,
  source: null, // {kind: 'mic'|'replay', stream: AudioStream, audio, muted}
};

// ------------------------------------------------------------------ transcript

function onTranscript(msg, { receivedAt = null, latency = null } = {}) {
  const { model, view } = state;
  if (msg.type === MessageType.PARTIAL || msg.type === MessageType.FINAL) {
    for (const id of model.supersededBy(msg)) view.removePartial(id);
  }
  if (msg.type === MessageType.PARTIAL) {
    const p = model.setPartial(msg, Date.now());
    if (p) view.showPartial(p);
  } else if (msg.type === MessageType.SPEAKER) {
    const f = model.setSpeaker(msg);
    if (f) view.updateSpeaker(f);
  } else if (msg.type === MessageType.FINAL) {
    const hadPartial = model.partials.has(msg.utterance_id);
    const r = model.addFinal(msg, { receivedAt, latency });
    if (!r) return;
    if (r.isNew) view.addFinal(r.final);
    else view.updateFinal(r.final);
    if (hadPartial && !r.isNew) view.removePartial(msg.utterance_id);
    renderLatency();
    for (const b of document.querySelectorAll('[data-export]')) b.disabled = false;
  }
}

function renderLatency() {
  const s = state.model.latencyStats();
  ui.latency.textContent = s
    ? `Final latency: last ${s.last.toFixed(2)} s · median ${s.median.toFixed(2)} s · p95 ${s.p95.toFixed(2)} s (${s.n})`
    : 'Final latency: — (of your own audio)';
}

function notice(n) {
  const who = n.source === 'feed' ? 'Transcript feed' : 'Your audio stream';
  if (n.kind === 'dropped') {
    state.view.addNotice(`${who} lost its connection (${n.reason}). Reconnecting…`, 'warn');
  } else if (n.kind === 'reconnected') {
    // Partials from before the drop may never be finalised (a restarted server); live
    // ones come back with the next partial, finished ones with their final.
    const mine = n.source === 'stream' && !n.resumed ? state.source?.stream?.participant : null;
    if (n.source === 'feed' || mine) {
      for (const id of state.model.dropPartials({ participant: mine ?? null })) state.view.removePartial(id);
    }
    let text = `${who} reconnected after ${n.downSeconds.toFixed(1)} s`;
    if (n.source === 'stream') {
      text += n.resumed
        ? `, resumed from ${n.resumeFrom.toFixed(1)} s; re-sent ${n.resendSeconds.toFixed(1)} s of audio.`
        : ` as a new stream; re-sent ${n.resendSeconds.toFixed(1)} s of audio not yet transcribed.`;
      if (n.lostSeconds > 0) text += ` ${n.lostSeconds.toFixed(1)} s of audio was too old to re-send.`;
    } else {
      text += '.';
    }
    state.view.addNotice(text, 'ok');
  } else if (n.kind === 'ended' && state.source?.stream) {
    // Our stream sent every final: whatever partial of ours is left had an empty final.
    const mine = state.source.stream.participant;
    for (const id of state.model.dropPartials({ participant: mine })) state.view.removePartial(id);
  } else if (n.kind === 'log-reset') {
    state.view.addNotice('The server restarted without this meeting’s log. Lines above are kept here; new lines follow.', 'warn');
  } else if (n.kind === 'error') {
    state.view.addNotice(`Server: ${n.message ?? n.code}`, 'error');
  }
}

// ------------------------------------------------------------------ status pills

/** Show a status pill. `{s}` in the text counts down the seconds to `delayMs` from now. */
function setPill(pill, stateName, text, delayMs = null) {
  pill.hidden = false;
  pill.dataset.state = stateName;
  pill.countdown = delayMs === null ? null : { text, until: performance.now() + delayMs };
  renderPill(pill, text);
}

function renderPill(pill, text) {
  const left = pill.countdown ? Math.max(0, Math.ceil((pill.countdown.until - performance.now()) / 1000)) : 0;
  const label = text.replace('{s}', `${left} s`);
  const node = pill.querySelector('.label');
  if (node.textContent !== label) node.textContent = label;
}

setInterval(() => {
  for (const pill of [ui.feedStatus, ui.streamStatus]) {
    if (pill.countdown) renderPill(pill, pill.countdown.text);
  }
}, 250);

function onFeedPhase(phase, d) {
  const secs = d.delayMs ? ' in {s}' : '';
  const text = {
    [FeedPhase.CONNECTING]: ['connecting', 'Transcript: connecting…'],
    [FeedPhase.LIVE]: ['live', 'Transcript: live'],
    [FeedPhase.WAITING]: ['waiting', `Transcript: waiting for the meeting to start${secs}`],
    [FeedPhase.RECONNECTING]: ['reconnecting', `Transcript: reconnecting${secs}`],
    [FeedPhase.CLOSED]: ['idle', 'Transcript: offline'],
    [FeedPhase.FAILED]: ['failed', `Transcript: ${d.reason ?? 'failed'}`],
  }[phase];
  setPill(ui.feedStatus, ...text, d.delayMs ?? null);
  ui.feedStatus.title = d.reason ? `Last close: ${d.reason}` : '';
}

function onStreamPhase(phase, d) {
  const src = state.source;
  const what = src?.kind === 'replay' ? 'Replay' : 'Microphone';
  const again = d.reconnects ? ` · reconnected ×${d.reconnects}` : '';
  let pill;
  switch (phase) {
    case StreamPhase.CONNECTING: pill = ['connecting', `${what}: connecting…`]; break;
    case StreamPhase.LIVE:
      pill = src?.muted ? ['muted', `${what}: muted${again}`] : ['live', `${what}: streaming${again}`];
      break;
    case StreamPhase.RECONNECTING:
      pill = ['reconnecting', `${what}: reconnecting in {s} (attempt ${d.attempt + 1})`, d.delayMs ?? 0];
      break;
    case StreamPhase.FINISHING: pill = ['connecting', `${what}: finishing…`]; break;
    case StreamPhase.ENDED:
      pill = ['idle', `${what}: ${src?.kind === 'replay' ? 'finished' : 'stopped'}${again}`];
      break;
    case StreamPhase.FAILED: pill = ['failed', `${what}: ${d.reason ?? 'failed'}`]; break;
    default: return;
  }
  setPill(ui.streamStatus, ...pill);
  ui.streamStatus.title = d.reason ? `Last close: ${d.reason}` : '';
  if ((phase === StreamPhase.ENDED || phase === StreamPhase.FAILED) && src?.stream?.ended) {
    releaseSource(src, phase === StreamPhase.FAILED ? d.reason : null);
  }
}

// ------------------------------------------------------------------ meeting

function shareLink(meetingId) {
  const url = new URL(location.pathname, location.href);
  url.searchParams.set('meeting', meetingId);
  if (TOKEN_URL) url.searchParams.set('token_url', TOKEN_URL);
  return url.toString();
}

function meetingToken(scope) {
  return fetchToken(TOKEN_URL, state.meetingId, scope);
}

function enterMeeting(meetingId, { language }) {
  leaveMeeting({ keepView: false });
  state.meetingId = meetingId;
  state.language = language;
  history.replaceState(null, '', shareLink(meetingId));
  ui.meetingLabel.textContent = meetingId;
  ui.meetingInfo.hidden = false;
  ui.shareLink.value = shareLink(meetingId);
  ui.join.hidden = true;
  ui.meeting.hidden = false;
  document.title = `${meetingId} — Parley`;
  state.feed = new MeetingFeed({
    base: BASE, meetingId,
    getLastSeq: () => state.model.lastSeq,
    onTranscript, onPhase: onFeedPhase, onNotice: notice,
    token: TOKEN_URL ? meetingToken : null,
  });
  state.feed.start();
  $('transcript-title').focus({ preventScroll: true }); // the join form just vanished
}

function leaveMeeting() {
  stopSource({ wait: false });
  state.feed?.stop();
  state.feed = null;
  state.model = new TranscriptModel();
  state.view.clear();
  renderLatency();
  for (const b of document.querySelectorAll('[data-export]')) b.disabled = true;
  ui.feedStatus.hidden = true;
  ui.streamStatus.hidden = true;
  ui.meetingInfo.hidden = true;
  ui.meeting.hidden = true;
  ui.join.hidden = false;
  document.title = 'Parley — live meeting transcript';
}

// ------------------------------------------------------------------ sources

function speakerId() {
  const name = ui.speakerName.value.trim();
  const id = participantId(name);
  showError(ui.speakerError, ui.speakerName,
    id ? null : 'Enter your name first: it labels what you say.');
  if (id) localStorage.setItem(NAME_KEY, name);
  return id || null;
}

function newStream(participant, diarize = false) {
  return new AudioStream({
    base: BASE, meetingId: state.meetingId, participant, language: state.language, diarize,
    getLastSeq: () => state.model.lastSeq,
    onPhase: onStreamPhase,
    onTranscript: (msg, meta) => onTranscript(msg, meta),
    onNotice: notice,
    protocols: TOKEN_URL ? async () => socketProtocols(await meetingToken('stream')) : null,
  });
}

function syncControls() {
  const src = state.source;
  const mic = src?.kind === 'mic';
  const replay = src?.kind === 'replay';
  ui.micStart.hidden = mic;
  ui.micStart.disabled = Boolean(src);
  ui.micMute.hidden = !mic;
  ui.micStop.hidden = !mic;
  ui.meterRow.hidden = !src;
  if (src) (replay ? ui.replayCard.querySelector('.progress-row') : ui.micHelp).before(ui.meterRow);
  ui.micHelp.hidden = !mic;
  ui.speakerName.disabled = Boolean(src);
  ui.replayStart.hidden = replay;
  ui.replayStart.disabled = Boolean(src) || !ui.replayFile.files?.length;
  ui.replayStop.hidden = !replay;
  ui.replayFile.disabled = replay;
  ui.micMute.textContent = src?.muted ? 'Unmute' : 'Mute';
  ui.micMute.setAttribute('aria-pressed', String(Boolean(src?.muted)));
  if (!src) setMeter(0);
}

let meterShown = -60;
function setMeter(rms) {
  const db = rms > 0 ? Math.max(-60, 20 * Math.log10(rms)) : -60;
  meterShown = Math.max(db, meterShown - 3); // fall back gently
  const frac = (meterShown + 60) / 60;
  ui.meterFill.style.transform = `scaleX(${frac.toFixed(3)})`;
  ui.meter.setAttribute('aria-valuenow', String(Math.round(meterShown)));
  ui.meter.setAttribute('aria-valuetext', meterShown <= -59 ? 'silent' : `${Math.round(meterShown)} dB`);
  ui.meter.dataset.hot = String(db > -3);
}

async function startMic() {
  const participant = speakerId();
  if (!participant || state.source) return;
  const stream = newStream(participant, ui.micDiarize.checked);
  const src = { kind: 'mic', stream, audio: null, muted: false };
  state.source = src;
  syncControls();
  stream.start(); // connect while the browser asks for the microphone; audio waits in the ring
  try {
    src.audio = await openMicrophone({
      onFrame: (pcm) => stream.pushFrame(pcm),
      onLevel: (rms) => setMeter(src.muted ? 0 : rms),
      onEnded: () => stopSource({ wait: true }),
    });
  } catch (err) {
    releaseSource(src, micError(err));
    stream.abort();
    setPill(ui.streamStatus, 'failed', 'Microphone: unavailable');
    return;
  }
  if (state.source !== src) { // stopped while the permission prompt was open
    await src.audio.stop();
    return;
  }
  ui.micMute.focus();
}

function micError(err) {
  if (err?.name === 'NotAllowedError') return 'Microphone permission was denied. Allow it in the address bar, or watch only.';
  if (err?.name === 'NotFoundError') return 'No microphone found.';
  return `Could not open the microphone: ${err?.message ?? err}`;
}

function toggleMute() {
  const src = state.source;
  if (src?.kind !== 'mic' || !src.audio) return;
  src.muted = !src.muted;
  src.audio.setMuted(src.muted);
  syncControls();
  if (src.stream.phase === StreamPhase.LIVE) onStreamPhase(StreamPhase.LIVE, { reconnects: src.stream.reconnects });
}

async function startReplay() {
  const participant = speakerId();
  const file = ui.replayFile.files?.[0];
  if (!participant || !file || state.source) return;
  const src = { kind: 'replay', stream: null, audio: null, muted: false };
  state.source = src;
  syncControls();
  ui.replayRow.hidden = false;
  ui.replayStatus.textContent = `Decoding ${file.name}…`;
  ui.replayProgress.removeAttribute('value');
  let buffer;
  try {
    buffer = await decodeFile(file);
  } catch (err) {
    releaseSource(src, `Could not decode ${file.name}: ${err?.message ?? 'unsupported format'}`);
    return;
  }
  if (state.source !== src) return;
  const stream = newStream(participant, ui.replayDiarize.checked);
  src.stream = stream;
  stream.start();
  src.audio = await playBuffer(buffer, {
    monitor: ui.replayMonitor.checked,
    onFrame: (pcm) => stream.pushFrame(pcm),
    onLevel: (rms) => setMeter(rms),
    onEnded: () => {
      ui.replayStatus.textContent = 'Sent; waiting for the last lines…';
      stream.finish();
    },
  });
  const tick = () => {
    if (state.source !== src) return;
    const pos = src.audio.position;
    ui.replayProgress.value = pos / buffer.duration;
    if (!stream.finishing) ui.replayStatus.textContent = `${pos.toFixed(1)} / ${buffer.duration.toFixed(1)} s`;
    requestAnimationFrame(tick);
  };
  tick();
}

/** Stop the current source. wait: send the rest and `stop`, keep the socket for the last finals. */
async function stopSource({ wait }) {
  const src = state.source;
  if (!src) return;
  if (!src.stream) { // a replay still decoding its file
    releaseSource(src, 'Replay cancelled.');
    return;
  }
  if (wait) {
    await src.audio?.stop(); // flushes the worklet's last frame into the stream
    src.stream.finish();
    if (src.kind === 'mic') { ui.micStop.disabled = true; ui.micMute.disabled = true; }
    else ui.replayStop.disabled = true;
  } else {
    src.stream.abort();
    await src.audio?.stop();
    releaseSource(src);
  }
}

function releaseSource(src, error = null) {
  if (state.source !== src) return;
  state.source = null;
  src.audio?.stop?.().catch(() => {});
  ui.micStop.disabled = false;
  ui.micMute.disabled = false;
  ui.replayStop.disabled = false;
  if (src.kind === 'replay') {
    ui.replayStatus.textContent = error ?? 'Replay finished.';
    ui.replayProgress.value = error ? 0 : 1;
  }
  showError(ui.speakerError, ui.speakerName, error && src.kind === 'mic' ? error : null);
  syncControls();
}

// ------------------------------------------------------------------ export, share

function download(format) {
  const { render, mime } = FORMATS[format];
  const text = render(state.model.finals, { meetingId: state.meetingId });
  const blob = new Blob([text], { type: mime });
  const a = document.createElement('a');
  a.href = URL.createObjectURL(blob);
  a.download = `parley-${state.meetingId}.${format}`;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 10000);
}

async function copyLink() {
  const link = ui.shareLink.value;
  try {
    await navigator.clipboard.writeText(link);
  } catch {
    ui.shareLink.select(); // no clipboard API (plain http): leave it selected to copy by hand
    if (!document.execCommand?.('copy')) {
      ui.copyStatus.textContent = 'Selected: press Ctrl+C (⌘C) to copy.';
      return;
    }
  }
  ui.copyStatus.textContent = 'Link copied.';
  setTimeout(() => { ui.copyStatus.textContent = ''; }, 4000);
}

// ------------------------------------------------------------------ forms

function showError(node, input, message) {
  node.hidden = !message;
  node.textContent = message ?? '';
  if (message) input.setAttribute('aria-invalid', 'true'); else input.removeAttribute('aria-invalid');
}

function readJoinForm({ needName }) {
  const meetingId = ui.meetingId.value.trim();
  const name = ui.yourName.value.trim();
  const meetingOk = isValidId(meetingId);
  const nameOk = !needName || participantId(name) !== '';
  showError(ui.meetingError, ui.meetingId, meetingOk ? null
    : meetingId ? 'Use 1–128 letters, digits, “.”, “-” or “_”, starting with a letter or digit.'
      : 'Enter a meeting ID, or press “New meeting”.');
  showError(ui.nameError, ui.yourName, nameOk ? null : 'Enter your name: it labels what you say.');
  if (!meetingOk) ui.meetingId.focus(); else if (!nameOk) ui.yourName.focus();
  if (!meetingOk || !nameOk) return null;
  if (name) localStorage.setItem(NAME_KEY, name);
  ui.speakerName.value = name;
  return { meetingId, language: ui.language.value };
}

ui.newMeeting.addEventListener('click', () => {
  ui.meetingId.value = newMeetingId();
  showError(ui.meetingError, ui.meetingId, null);
  (ui.yourName.value ? ui.joinForm.querySelector('#join-mic') : ui.yourName).focus();
});
ui.joinForm.addEventListener('submit', (ev) => {
  ev.preventDefault();
  const f = readJoinForm({ needName: true });
  if (!f) return;
  enterMeeting(f.meetingId, f);
  startMic();
});
ui.joinWatch.addEventListener('click', () => {
  const f = readJoinForm({ needName: false });
  if (f) enterMeeting(f.meetingId, f);
});
ui.micStart.addEventListener('click', () => startMic());
ui.micMute.addEventListener('click', toggleMute);
ui.micStop.addEventListener('click', () => stopSource({ wait: true }));
ui.replayFile.addEventListener('change', syncControls);
ui.replayStart.addEventListener('click', () => startReplay());
ui.replayStop.addEventListener('click', () => stopSource({ wait: true }));
ui.copyLink.addEventListener('click', copyLink);
ui.leave.addEventListener('click', () => { leaveMeeting(); ui.meetingId.focus(); });
for (const b of document.querySelectorAll('[data-export]')) {
  b.addEventListener('click', () => download(b.dataset.export));
}
document.addEventListener('keydown', (ev) => {
  if (ev.key.toLowerCase() !== 'm' || ev.ctrlKey || ev.metaKey || ev.altKey) return;
  if (ev.target.closest?.('input, select, textarea, [contenteditable]')) return;
  if (state.source?.kind === 'mic') { ev.preventDefault(); toggleMute(); }
});
// Partials whose source vanished without a final: drop them after a while.
setInterval(() => {
  for (const id of state.model.dropPartials({ olderThan: Date.now() - 30000 })) state.view.removePartial(id);
}, 5000);

// ------------------------------------------------------------------ start-up

{
  const params = new URLSearchParams(location.search);
  const name = localStorage.getItem(NAME_KEY) ?? '';
  ui.yourName.value = name;
  ui.speakerName.value = name;
  const meeting = params.get('meeting');
  if (meeting) ui.meetingId.value = meeting;
  if (meeting && isValidId(meeting) && params.has('watch')) {
    enterMeeting(meeting, { language: params.get('language') ?? 'en' });
  } else if (meeting) {
    (name ? $('join-mic') : ui.yourName).focus();
  }
  syncControls();
  // For tests and the curious: the live state, read-only by convention.
  window.parley = { state, displayName };
}
