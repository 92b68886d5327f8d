// node --test static/tests/ : protocol helpers, ring buffer, transcript model, exports.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { onMeetingClock, timestamp, toJson, toSrt, toTxt, toVtt } from '../export.js';
import {
  backoffDelay, closeAction, eventsUrl, fetchToken, isValidId, newMeetingId, participantId,
  socketProtocols, streamUrl,
} from '../protocol.js';
import { PcmRing, resendPlan } from '../ringbuffer.js';
import { ReconnectingSocket } from '../socket.js';
import { TranscriptModel } from '../transcript-model.js';

const BASE = 'http://host:8000/';

test('stream URL carries protocol v1 query parameters, and resume ones when resuming', () => {
  const u = new URL(streamUrl(BASE, { meetingId: 'm-1', participant: 'Ada' }));
  assert.equal(u.protocol, 'ws:');
  assert.equal(u.pathname, '/v1/meetings/m-1/stream');
  assert.equal(u.searchParams.get('sample_rate'), '16000');
  assert.equal(u.searchParams.get('encoding'), 'pcm_s16le');
  assert.equal(u.searchParams.get('interim_results'), 'true');
  assert.equal(u.searchParams.get('resume_token'), null);
  const r = new URL(streamUrl('https://h/app/', {
    meetingId: 'm', participant: 'p', resume: { token: 'tok', lastSeq: 7 },
  }));
  assert.equal(r.protocol, 'wss:');
  assert.equal(r.pathname, '/app/v1/meetings/m/stream');
  assert.equal(r.searchParams.get('resume_token'), 'tok');
  assert.equal(r.searchParams.get('last_seq'), '7');
  const none = new URL(streamUrl(BASE, { meetingId: 'm', participant: 'p', resume: { token: 't', lastSeq: -1 } }));
  assert.equal(none.searchParams.get('last_seq'), '0');
  const ev = new URL(eventsUrl(BASE, { meetingId: 'm', afterSeq: -1 }));
  assert.equal(ev.pathname, '/v1/meetings/m/events');
  assert.equal(ev.search, '');
  assert.equal(new URL(eventsUrl(BASE, { meetingId: 'm', afterSeq: 12 })).searchParams.get('after_seq'), '12');
});

test('participant ids and meeting ids fit the server alphabet', () => {
  assert.equal(participantId('  Ada  Lovelace '), 'Ada_Lovelace');
  assert.equal(participantId('José Núñez!'), 'Jose_Nunez');
  assert.equal(participantId('__x'), 'x');
  for (let i = 0; i < 50; i++) assert.ok(isValidId(newMeetingId()));
  assert.ok(!isValidId('-bad'));
  assert.ok(!isValidId('has space'));
});

test('close codes map to reconnect decisions', () => {
  assert.equal(closeAction(1000), 'done');
  assert.equal(closeAction(1006), 'resume');
  assert.equal(closeAction(1012), 'resume');
  assert.equal(closeAction(1013), 'resume');
  assert.equal(closeAction(4400), 'fatal');
  assert.equal(closeAction(1011), 'fresh');
  assert.equal(closeAction(4409), 'fatal'); // resumed elsewhere: do not take it back
  assert.equal(closeAction(4404, { resuming: true }), 'fresh');
  assert.equal(closeAction(4404, { kind: 'events' }), 'wait');
  assert.equal(closeAction(1006, { stopping: true }), 'done');
  assert.equal(closeAction(1000, { kind: 'events' }), 'resume');
  assert.equal(closeAction(1008, { kind: 'events' }), 'resume'); // slow listener catches up
  assert.equal(closeAction(1008), 'fatal');
  assert.equal(closeAction(1008, { errorCode: 'slow_consumer' }), 'resume');
  assert.equal(closeAction(1013, { errorCode: 'overloaded' }), 'resume');
});

test('backoff grows, is capped, and is jittered', () => {
  assert.equal(backoffDelay(0, {}, () => 1), 500);
  assert.equal(backoffDelay(0, {}, () => 0), 250);
  assert.equal(backoffDelay(3, {}, () => 1), 4000);
  assert.equal(backoffDelay(30, {}, () => 1), 15000);
});

test('ring buffer keeps the newest samples by absolute index', () => {
  const ring = new PcmRing(10);
  ring.write(Int16Array.from([0, 1, 2, 3, 4, 5]));
  ring.write(Int16Array.from([6, 7, 8, 9, 10, 11, 12]));
  assert.equal(ring.end, 13);
  assert.equal(ring.start, 3);
  assert.deepEqual(Array.from(ring.read(0)), [3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
  assert.deepEqual(Array.from(ring.read(8, 11)), [8, 9, 10]);
  ring.write(Int16Array.from(Array.from({ length: 25 }, (_, i) => 100 + i)));
  assert.equal(ring.end, 38);
  assert.deepEqual(Array.from(ring.read(35)), [122, 123, 124]);
  assert.deepEqual(Array.from(ring.read(0, 2)), []);
});

const final = (seq, participant, text, start, end, extra = {}) => ({
  type: 'transcript.final', seq, utterance_id: `u${seq}`, participant, text, start, end,
  language: 'en', ...extra,
});

test('a resume re-sends from send_from when the ring holds it, and says so', () => {
  const sr = 16000;
  // The server names send_from 4.0 s before resume_from 7.744 s; the ring holds all of it.
  assert.deepEqual(resendPlan(0, 0, 7.744, 3.744, sr), { start: 3.744 * sr, from: 3.744, lost: 0 });
  // The ring starts after send_from: re-send what it holds of the lead, from there.
  assert.deepEqual(resendPlan(5 * sr, 0, 7.744, 3.744, sr), { start: 5 * sr, from: 5, lost: 0 });
  // No send_from (a server before it): from resume_from, with no resend message.
  assert.deepEqual(resendPlan(0, 0, 7.744, undefined, sr), { start: 7.744 * sr, from: null, lost: 0 });
  // The ring lost audio after resume_from: from its start, counted as lost.
  assert.deepEqual(resendPlan(8 * sr, 0, 7.744, 3.744, sr), { start: 8 * sr, from: null, lost: 8 * sr - 7.744 * sr });
  // A later timeline (ring index of stream position 0 is 32000): seconds are the stream's.
  assert.deepEqual(resendPlan(0, 2 * sr, 7.744, 3.744, sr), { start: 2 * sr + 3.744 * sr, from: 3.744, lost: 0 });
});

test('transcript model orders by seq, dedupes, and retires partials', () => {
  const m = new TranscriptModel();
  m.setPartial({ utterance_id: 'u1', participant: 'a', text: 'hel', start: 0, end: 1 });
  assert.equal(m.partials.size, 1);
  assert.equal(m.addFinal(final(1, 'a', 'hello', 0, 1)).isNew, true);
  assert.equal(m.partials.size, 0);
  assert.equal(m.setPartial({ utterance_id: 'u1', participant: 'a', text: 'late' }), null);
  m.addFinal(final(0, 'b', 'first', 0, 0.5));
  assert.equal(m.addFinal(final(1, 'a', 'hello', 0, 1), { latency: 0.7 }).isNew, false);
  assert.deepEqual(m.finals.map((f) => f.seq), [0, 1]);
  assert.equal(m.byKey.get('0:1').latency, 0.7);
  assert.equal(m.lastSeq, 1);
  assert.deepEqual(m.latencyStats(), { n: 1, last: 0.7, median: 0.7, p95: 0.7, max: 0.7 });
});

test('partials whose final never comes are retired by the next utterance', () => {
  const m = new TranscriptModel();
  m.setPartial({ utterance_id: 's-0', participant: 'a', text: 'uh', start: 0, end: 0.9 });
  m.setPartial({ utterance_id: 'x-0', participant: 'b', text: 'hi', start: 0, end: 0.9 });
  assert.deepEqual(m.supersededBy({ utterance_id: 's-0', participant: 'a', start: 0 }), []);
  // s-0's final was empty (never sent); s-1 starts later: s-0 is done. b is untouched.
  assert.deepEqual(m.supersededBy({ utterance_id: 's-1', participant: 'a', start: 1.5 }), ['s-0']);
  assert.deepEqual([...m.partials.keys()], ['x-0']);
});

test('a restarted server log (seq from 1 again, new utterances) is not taken for duplicates', () => {
  const m = new TranscriptModel();
  m.addFinal(final(1, 'a', 'one', 0, 1));
  m.addFinal(final(2, 'a', 'two', 1, 2));
  assert.equal(m.addFinal(final(1, 'a', 'one', 0, 1)).isNew, false); // replayed: duplicate
  const r = m.addFinal({ ...final(1, 'a', 'three', 0, 1), utterance_id: 'new-session-0' });
  assert.equal(r.isNew, true);
  assert.deepEqual(m.finals.map((f) => f.text), ['one', 'two', 'three']);
  assert.equal(m.lastSeq, 1);
});

test('timestamps format as SRT and VTT want them', () => {
  assert.equal(timestamp(3725.5), '01:02:05,500');
  assert.equal(timestamp(0.0004, '.'), '00:00:00.000');
  assert.equal(timestamp(59.9996), '00:01:00,000');
});

const SRT_BLOCK = /^(\d+)\n(\d{2}):(\d{2}):(\d{2}),(\d{3}) --> (\d{2}):(\d{2}):(\d{2}),(\d{3})\n(.+)$/;

test('SRT export is valid SubRip', () => {
  const finals = [
    final(0, 'Ada_L', 'Hello there.', 0.32, 1.9),
    final(1, 'Ada_L', 'Second line.', 2.5, 2.5),
    final(2, 'Ada_L', '  ', 3, 4),
  ].map((f) => new TranscriptModel().addFinal(f).final);
  const srt = toSrt(finals);
  const blocks = srt.trimEnd().split('\n\n');
  assert.equal(blocks.length, 2);
  blocks.forEach((b, i) => {
    const m = SRT_BLOCK.exec(b);
    assert.ok(m, `block ${i}: ${JSON.stringify(b)}`);
    assert.equal(Number(m[1]), i + 1);
    const t = (h, mi, s, ms) => Number(h) * 3600 + Number(mi) * 60 + Number(s) + Number(ms) / 1000;
    assert.ok(t(m[6], m[7], m[8], m[9]) > t(m[2], m[3], m[4], m[5]));
  });
  assert.match(blocks[0], /Ada L: Hello there\.$/);
  assert.match(blocks[0], /00:00:00,320 --> 00:00:01,900/);
});

test('VTT export has a header, voice spans and escapes markup', () => {
  const m = new TranscriptModel();
  m.addFinal(final(0, 'Bo', 'a < b & c', 1, 2));
  const vtt = toVtt(m.finals, { meetingId: 'x' });
  assert.ok(vtt.startsWith('WEBVTT'));
  assert.match(vtt, /00:00:01\.000 --> 00:00:02\.000\n<v Bo>a &lt; b &amp; c\n/);
});

test('several sources are placed on one meeting clock by arrival', () => {
  const m = new TranscriptModel();
  // Ada started at wall 100 s; Bo joined 30 s later (his clock restarts at 0).
  m.addFinal(final(0, 'Ada', 'one', 1, 3), { receivedAt: 103_800 });
  m.addFinal(final(1, 'Bo', 'two', 2, 4), { receivedAt: 134_600 });
  m.addFinal(final(2, 'Ada', 'three', 40, 42), { receivedAt: 142_900 });
  const placed = onMeetingClock(m.finals);
  assert.deepEqual(placed.map((f) => f.seq), [0, 1, 2]);
  assert.equal(placed[1].meetingStart.toFixed(1), '31.8'); // 2 + (130.6 − 100.8)
  const txt = toTxt(m.finals);
  assert.match(txt, /\[0:31\] Bo: two/);
  const json = JSON.parse(toJson(m.finals, { meetingId: 'm' }));
  assert.equal(json.finals.length, 3);
  assert.equal(json.finals[0].meeting_start, 1);
});

test('finals with the server\'s wall_time are placed by it, not by arrival', () => {
  const m = new TranscriptModel();
  // Bo's short phrase was logged first (seq 1), though Ada started 2.5 s before him.
  const wall = (origin, start, end) => ({ wall_time: { start: origin + start, end: origin + end } });
  m.addFinal(final(1, 'Bo', 'short', 0.5, 1.5, wall(1002.5, 0.5, 1.5)), { receivedAt: 1_004_000 });
  m.addFinal(final(2, 'Ada', 'long', 0.2, 6, wall(1000, 0.2, 6)), { receivedAt: 1_006_500 });
  const placed = onMeetingClock(m.finals);
  assert.deepEqual(placed.map((f) => f.seq), [2, 1]);
  assert.deepEqual(placed.map((f) => f.meetingStart), [0.2, 3]);
  assert.match(toTxt(m.finals), /\[0:00\] Ada: long\n\[0:03\] Bo: short/);
});

test('limits and quotas reconnect; meeting tokens ride as a subprotocol', async () => {
  assert.equal(closeAction(4413, { errorCode: 'max_duration' }), 'resume');
  assert.equal(closeAction(4429, { errorCode: 'quota_exceeded' }), 'resume');
  assert.equal(closeAction(4401, { errorCode: 'unauthorized' }), 'fatal');
  assert.equal(socketProtocols(null), undefined);
  assert.deepEqual(socketProtocols('pmt_abc'), ['parley.v1', 'parley.token.pmt_abc']);
  const calls = [];
  const fakeFetch = async (url, init) => {
    calls.push([url, JSON.parse(init.body)]);
    return { ok: true, json: async () => ({ token: 'pmt_xyz' }) };
  };
  assert.equal(await fetchToken('/t', 'standup', 'events', fakeFetch), 'pmt_xyz');
  assert.deepEqual(calls, [['/t', { meeting_id: 'standup', scope: 'events' }]]);
  const refused = async () => ({ ok: false, status: 403 });
  await assert.rejects(fetchToken('/t', 'standup', 'stream', refused), /403/);
});

test('a socket asks for fresh subprotocols on every attempt, and backs off when it cannot', async () => {
  const opened = [];
  class FakeWs {
    constructor(url, protocols) { opened.push([url, protocols]); this.readyState = 0; }
    close() {}
  }
  let n = 0;
  const states = [];
  const socket = new ReconnectingSocket({
    url: () => 'ws://x/v1/meetings/m/events',
    onClose: () => 'resume',
    onMessage: () => {},
    onState: (s) => states.push(s.state),
    WebSocketImpl: FakeWs,
    protocols: async () => {
      n += 1;
      if (n === 1) throw new Error('token endpoint down');
      return socketProtocols(`pmt_${n}`);
    },
    backoff: { base: 1, max: 2 },
  });
  socket.start();
  await new Promise((resolve) => setTimeout(resolve, 50));
  assert.deepEqual(opened, [['ws://x/v1/meetings/m/events', ['parley.v1', 'parley.token.pmt_2']]]);
  assert.deepEqual(states.slice(0, 3), ['connecting', 'waiting', 'connecting']);
  socket.stop();
});

test('diarized finals carry their speaker; transcript.speaker relabels one; exports show it', () => {
  const url = new URL(streamUrl('http://h/', { meetingId: 'm', participant: 'room', diarize: true }));
  assert.equal(url.searchParams.get('diarize'), 'true');
  assert.equal(new URL(streamUrl('http://h/', { meetingId: 'm', participant: 'p' })).searchParams.has('diarize'), false);
  const model = new TranscriptModel();
  model.addFinal({ seq: 1, utterance_id: 'a-0', participant: 'room', text: 'Hello there.', start: 0, end: 1, speaker: 'S1' });
  model.addFinal({ seq: 2, utterance_id: 'a-0.1', participant: 'room', text: 'Hi.', start: 1.2, end: 1.8, speaker: 'S1' });
  assert.equal(model.setSpeaker({ type: 'transcript.speaker', utterance_id: 'a-0.1', speaker: 'S2' }).speaker, 'S2');
  assert.equal(model.setSpeaker({ type: 'transcript.speaker', utterance_id: 'a-0.1', speaker: 'S2' }), null);
  assert.equal(model.setSpeaker({ type: 'transcript.speaker', utterance_id: 'nope', speaker: 'S2' }), null);
  assert.match(toTxt(model.finals), /room \(S2\): Hi\./);
  assert.match(toVtt(model.finals), /<v room \(S1\)>Hello there\./);
  assert.deepEqual(JSON.parse(toJson(model.finals)).finals.map((f) => f.speaker), ['S1', 'S2']);
});
